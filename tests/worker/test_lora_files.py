"""Adapter files made by Tide (worker/lora/files.py): a random adapter is one peft reads as
Tide does, and the adapter merged into a copy of its base generates what the base serving
the adapter generates."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.worker.test_lora_reference import _greedy, _prompts
from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.worker.engine.llm_engine import LLMEngine
from tide_fleet.worker.lora.files import merge_adapter, write_random_adapter


def _tide(model: Path, adapter: Path | None) -> list[list[int]]:
    engine = LLMEngine.from_pretrained(str(model), dtype="float32", kv_cache_memory=16 << 20,
                                       max_loras=1 if adapter else 0)  # fmt: skip
    if adapter is not None:
        engine.register_adapter("x", str(adapter))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = _prompts()[:3]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params, lora="x" if adapter else None)
    done = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    return [done[f"r{i}"] for i in range(len(prompts))]


def test_a_random_adapter_reads_in_peft_as_in_tide(stories_path, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = ModelConfig.from_folder(stories_path)
    folder = write_random_adapter(tmp_path / "r", config, 8, ("q", "v", "gate", "down"), 4,
                                  std=0.3)  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(str(stories_path), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    expected = [_greedy(model, p) for p in _prompts()[:3]]
    assert _tide(stories_path, folder) == expected
    assert expected != _tide(stories_path, None)  # it changes what the model says


def test_the_merged_model_generates_what_the_adapter_does(stories_path, tmp_path):
    config = ModelConfig.from_folder(stories_path)
    folder = write_random_adapter(tmp_path / "r", config, 8, ("k", "o", "up"), 5, std=0.3)
    merged = merge_adapter(stories_path, folder, tmp_path / "merged")
    assert _tide(merged, None) == _tide(stories_path, folder)
