"""Bad input gets a clear error that names the field and the limit."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.conftest import make_engine
from tide_fleet.infra.contract.model_config import ModelLoadError
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.models.loader import load_model


@pytest.fixture(scope="module")
def engine(tiny_path):
    return make_engine(tiny_path)


def test_prompt_longer_than_context_names_both_numbers(engine):
    with pytest.raises(ValueError, match=r"prompt has 1500 tokens but the model's context is 1024"):
        engine.add_request("long", [5] * 1500, SamplingParams(max_tokens=1))


def test_prompt_plus_max_tokens_over_context(engine):
    with pytest.raises(ValueError, match=r"1000 tokens\) \+ max_tokens \(100\) = 1100 .* 1024"):
        engine.add_request("long", [5] * 1000, SamplingParams(max_tokens=100))


def test_empty_prompt(engine):
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("empty", [], SamplingParams())


def test_token_outside_vocab(engine):
    with pytest.raises(ValueError, match=r"token id 999 is outside the vocabulary \[0, 260\)"):
        engine.add_request("oov", [1, 999], SamplingParams())


def test_nothing_is_left_behind_after_rejection(engine):
    with pytest.raises(ValueError):
        engine.add_request("bad", [5] * 2000, SamplingParams())
    assert not engine.has_unfinished()
    engine.block_manager.assert_all_free()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer"),
        ({"temperature": -0.5}, r"temperature must be in \[0, 100\], got -0.5"),
        ({"temperature": "hot"}, "temperature must be a number"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
        ({"top_k": -3}, "top_k must be -1"),
        ({"seed": -1}, "seed must be in"),
        ({"stop": [""]}, "stop strings must be non-empty"),
    ],
)
def test_sampling_params_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_unknown_architecture_lists_supported(tmp_path, tiny_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_path, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        ModelLoadError, match="LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"
    ):
        load_model(folder, "float32", "cpu")


def test_missing_files_are_named(tmp_path, tiny_path):
    with pytest.raises(ModelLoadError, match="model folder not found"):
        load_model(tmp_path / "nope")
    folder = tmp_path / "m"
    shutil.copytree(tiny_path, folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"need model.safetensors or model.safetensors.index"):
        load_model(folder, "float32", "cpu")
    (folder / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"missing file: .*config.json"):
        load_model(folder, "float32", "cpu")


def test_shape_mismatch_names_tensor_and_shapes(tmp_path, tiny_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_path, folder)
    weights = load_file(str(folder / "model.safetensors"))
    weights["model.layers.1.mlp.down_proj.weight"] = weights["model.layers.1.mlp.down_proj.weight"][
        :, :100
    ].clone()
    save_file(weights, str(folder / "model.safetensors"))
    expected = (
        "'model.layers.1.mlp.down_proj.weight': checkpoint has (64, 100), config expects (64, 128)"
    )
    with pytest.raises(ModelLoadError, match=re.escape(expected)):
        load_model(folder, "float32", "cpu")


def test_missing_tensor_is_named(tmp_path, tiny_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_path, folder)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=re.escape("missing tensor 'lm_head.weight'")):
        load_model(folder, "float32", "cpu")
