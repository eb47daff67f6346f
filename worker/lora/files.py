"""Adapter files made here: random PEFT-format adapters for any base (benchmarks, the GPU
check: no training and no peft needed), and an adapter merged into a copy of its base
(the one-model-per-fine-tune way of serving it, which the benchmark compares against)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tide_fleet.infra.contract.adapters import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    module_shapes,
    read_adapter,
)
from tide_fleet.infra.contract.model_config import ModelConfig

PEFT_NAMES = {"q": ("self_attn", "q_proj"), "k": ("self_attn", "k_proj"),
              "v": ("self_attn", "v_proj"), "o": ("self_attn", "o_proj"),
              "gate": ("mlp", "gate_proj"), "up": ("mlp", "up_proj"),
              "down": ("mlp", "down_proj")}  # fmt: skip


def write_random_adapter(
    folder: Path, config: ModelConfig, rank: int, targets: tuple[str, ...], seed: int,
    alpha: float | None = None, std: float = 0.02,
) -> Path:  # fmt: skip
    """A PEFT-format adapter (``adapter_config.json`` + ``adapter_model.safetensors``) with
    N(0, std) A and B on `targets` (Tide's names: q, k, v, o, gate, up, down) of every layer."""
    g = torch.Generator().manual_seed(seed)
    shapes = module_shapes(config)
    tensors = {}
    for layer in range(config.num_layers):
        for module in targets:
            block, name = PEFT_NAMES[module]
            n_in, n_out = shapes[module]
            key = f"base_model.model.model.layers.{layer}.{block}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g) * std
            tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g) * std
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS_FILE))
    config_json = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha or 2 * rank,
                   "target_modules": [PEFT_NAMES[m][1] for m in targets], "bias": "none",
                   "task_type": "CAUSAL_LM"}  # fmt: skip
    (folder / CONFIG_FILE).write_text(json.dumps(config_json, indent=2))
    return folder


def merge_adapter(base: Path, adapter: Path, out: Path) -> Path:
    """A copy of the model folder `base` with the adapter merged into its weights
    (W + scaling * B A): the fine-tune as a model of its own."""
    config = ModelConfig.from_folder(base)
    spec = read_adapter("merged", str(adapter), config)
    if not (base / "model.safetensors").is_file():
        raise ValueError(f"merge_adapter: {base} has no single model.safetensors")
    weights = load_file(str(base / "model.safetensors"))
    lora = load_file(str(adapter / WEIGHTS_FILE))
    for mod in spec.modules:
        if mod.module not in PEFT_NAMES:
            raise ValueError(f"merge_adapter: fused module {mod.module!r} is not merged here")
        block, name = PEFT_NAMES[mod.module]
        key = f"model.layers.{mod.layer}.{block}.{name}.weight"
        w = weights[key]
        delta = lora[mod.key_b].float() @ lora[mod.key_a].float() * mod.scaling
        weights[key] = (w.float() + delta).to(w.dtype)
    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    save_file(weights, str(out / "model.safetensors"))
    return out
