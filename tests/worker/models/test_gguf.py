"""GGUF files against transformers' own GGUF loader (an independent reader, dequantiser and
tokenizer builder) on the same files: dequantised weights bit for bit in every tensor type
Tide reads, for Llama (q/k rows permuted back) and Qwen2 (biases, no permutation); the
same token ids; the same greedy tokens; and files Tide cannot serve refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import make_engine
from tests.worker.models.gguf_files import T, write_gguf
from tide_fleet.infra.contract.gguf_file import gguf_folder, gguf_path
from tide_fleet.infra.contract.model_config import ModelLoadError
from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.worker.engine import SamplingParams

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
safetensors_torch = pytest.importorskip("safetensors.torch")

CASES = [("llama", k) for k in (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q5_K,
                                T.Q6_K)] + [("qwen2", k) for k in (T.Q8_0, T.Q4_K)]  # fmt: skip


def reference(path: Path):  # type: ignore[no-untyped-def]
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )


@pytest.mark.parametrize(("arch", "kind"), CASES, ids=lambda v: getattr(v, "name", v))
def test_weights_equal_transformers_dequantised(tmp_path, arch, kind):
    path = write_gguf(tmp_path / f"{arch}.gguf", arch=arch, kind=kind)
    folder = gguf_folder(path, tmp_path / "cache")
    mine = safetensors_torch.load_file(str(folder / "model.safetensors"))
    theirs = reference(path).state_dict()
    assert set(mine) == set(theirs)
    for name, w in theirs.items():
        assert torch.equal(mine[name], w), name


@pytest.mark.parametrize(("arch", "kind"), [("llama", T.Q4_K), ("qwen2", T.Q8_0)])
def test_greedy_tokens_equal_transformers(tmp_path, arch, kind):
    path = write_gguf(tmp_path / f"{arch}.gguf", arch=arch, kind=kind, seed=3)
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    model = reference(path)
    engine = make_engine(gguf_folder(path, tmp_path / "cache"))
    prompts = ["the theater in a thin tin", "a thin theme", "hello there", "in the end"]
    for text in prompts:
        ids = tok(text).input_ids
        assert engine.tokenizer.encode(text) == ids
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                             min_new_tokens=12)  # fmt: skip
        mine = engine.generate([ids], SamplingParams(temperature=0.0, max_tokens=12,
                                                     ignore_eos=True))[0]  # fmt: skip
        assert mine.token_ids == out[0, len(ids) :].tolist(), text


def test_token_ids_and_special_tokens_equal_transformers(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    mine = Tokenizer(gguf_folder(path, tmp_path / "cache"))
    for text in ["the theater", "Hello <think> world</s> 123", "  spaces\n\nand <s> é ü"]:
        assert mine.encode(text) == tok(text).input_ids, text
    assert mine.bos_token_id == 1 and mine.eos_token_ids == [2] and mine.add_bos
    assert mine.chat_template is not None


def test_the_folder_is_keyed_by_content_and_built_once(tmp_path):
    a = write_gguf(tmp_path / "a.gguf", seed=1)
    first = gguf_folder(a, tmp_path / "cache")
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert gguf_folder(a, tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime  # not rebuilt
    (tmp_path / "b").mkdir()
    b = write_gguf(tmp_path / "b" / "a.gguf", seed=2)
    assert gguf_folder(b, tmp_path / "cache") != first  # same name, other content
    assert gguf_path(tmp_path / "b") == b  # a folder holding one GGUF file


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"arch": "gpt2"}, "GGUF architecture 'gpt2' is not one Tide serves"),
    ({"tensors": {"blk.0.ffn_up.weight": T.Q5_0}}, "blk.0.ffn_up.weight is of type Q5_0"),
    ({"tokenizer": "llama"}, "SentencePiece vocabulary is not supported"),
])  # fmt: skip
def test_a_file_tide_cannot_serve_is_refused_by_name(tmp_path, kwargs, message):
    path = write_gguf(tmp_path / "m.gguf", **kwargs)
    with pytest.raises(ModelLoadError, match=message):
        gguf_folder(path, tmp_path / "cache")
    assert not list((tmp_path / "cache" / "gguf").iterdir())  # nothing half-written
