"""Logits and greedy tokens against independent references: HF transformers and llama2.c."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.kernels import AttentionMetadata
from tide_fleet.kernels.attention_metadata import PrefillChunk
from tide_fleet.worker.engine import EngineConfig, LLMEngine, SamplingParams
from tide_fleet.worker.models.loader import load_model

transformers = pytest.importorskip("transformers")


def tide_prefill_logits(
    path: Path, ids: list[int], dtype: str = "float32", native: bool = True
) -> torch.Tensor:
    """All-position logits of one prompt through Tide's model and paged cache.

    native=False takes the torch spelling of the layer (what CUDA runs) instead of the
    CPU native ops.
    """
    model = load_model(path, dtype, "cpu")
    if not native:
        model.native = None
    engine = LLMEngine(model, None, EngineConfig(num_kv_blocks=64))
    n = len(ids)
    table = torch.arange(-(-n // engine.config.block_size))
    meta = AttentionMetadata(slot_mapping=torch.arange(n), block_size=engine.config.block_size)
    meta.prefills.append(PrefillChunk(slice(0, n), 0, table))
    pos = torch.arange(n)
    return engine.model.forward(
        torch.tensor(ids), pos, engine.runner.kv_caches, meta, torch.arange(n)
    )


def hf_logits(path: Path, ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def hf_greedy(path: Path, ids: list[int], max_new: int) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, eos_token_id=None
    )
    return out[0, len(ids) :].tolist()


def test_stories260k_reproduces_llama2c_references(stories_path, stories_refs):
    engine = make_engine(stories_path)
    prompts = [engine.tokenizer.encode(r["prompt"]) for r in stories_refs]
    for ref, ids in zip(stories_refs, prompts, strict=True):
        assert ids == ref["prompt_ids"]
    params = [SamplingParams(max_tokens=r["max_new_tokens"], temperature=0.0) for r in stories_refs]
    outs = engine.generate(prompts, params)
    for ref, out in zip(stories_refs, outs, strict=True):
        assert out.token_ids == ref["new_ids"], ref["prompt"]
        assert out.text == ref["continuation"]
    engine.block_manager.assert_all_free()


def test_stories260k_logits_match_transformers(stories_path):
    ids = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376]
    torch.testing.assert_close(
        tide_prefill_logits(stories_path, ids), hf_logits(stories_path, ids), atol=1e-4, rtol=1e-4
    )


def test_dummy_tiny_logits_and_greedy_match_transformers(tiny_path):
    ids = [1, *range(10, 60)]
    torch.testing.assert_close(
        tide_prefill_logits(tiny_path, ids), hf_logits(tiny_path, ids), atol=1e-4, rtol=1e-4
    )
    engine = make_engine(tiny_path)
    out = engine.generate([ids], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    assert out[0].token_ids == hf_greedy(tiny_path, ids, 24)


def _save_hf(config, folder: Path, shard: str | None = None) -> Path:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(str(folder), **kwargs)
    return folder


VARIANTS = {
    "qwen2-qkv-bias": lambda: transformers.Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True,
    ),
    "mistral": lambda: transformers.MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
        sliding_window=None,
    ),
    "llama3-rope-scaling": lambda: transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
}  # fmt: skip


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_architecture_variants_match_transformers(tmp_path, variant):
    folder = _save_hf(VARIANTS[variant](), tmp_path / variant, shard="40KB")
    assert (folder / "model.safetensors.index.json").is_file(), "expected a sharded checkpoint"
    ids = list(range(3, 120, 2))
    torch.testing.assert_close(
        tide_prefill_logits(folder, ids), hf_logits(folder, ids), atol=1e-4, rtol=1e-4
    )


def test_bfloat16_stays_close_to_float32(tiny_path):
    ids = list(range(5, 40))
    m32 = load_model(tiny_path, "float32", "cpu")
    m16 = load_model(tiny_path, "bfloat16", "cpu")
    assert m16.dtype == torch.bfloat16 and m32.dtype == torch.float32
    ref = tide_prefill_logits(tiny_path, ids)
    engine = make_engine(tiny_path, dtype="bfloat16", num_kv_blocks=64)
    n = len(ids)
    meta = AttentionMetadata(slot_mapping=torch.arange(n), block_size=16)
    meta.prefills.append(PrefillChunk(slice(0, n), 0, torch.arange(3)))
    got = engine.model.forward(
        torch.tensor(ids), torch.arange(n), engine.runner.kv_caches, meta, torch.arange(n)
    )
    assert (got - ref).abs().max() < 0.05


@pytest.mark.parametrize("native", [True, False], ids=["native-ops", "torch-ops"])
def test_both_layer_paths_match_transformers(tiny_path, native):
    ids = list(range(3, 90))
    ref = hf_logits(tiny_path, ids)
    got = tide_prefill_logits(tiny_path, ids, native=native)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    # bf16: no further from the fp32 reference than twice transformers' own bf16 error.
    hf_error = (hf_logits(tiny_path, ids, torch.bfloat16) - ref).abs().max()
    got16 = tide_prefill_logits(tiny_path, ids, "bfloat16", native=native)
    assert (got16 - ref).abs().max() <= 2 * hf_error
