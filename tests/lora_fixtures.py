"""LoRA adapters for tests, written by ``peft`` itself (the reference for the format).

``make_adapter`` seeds torch, wraps the base model in a ``LoraConfig`` with random (not zero)
B matrices, and saves the adapter folder as ``save_pretrained`` does; tests of the gateway,
the contract reader and the engine share it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def make_adapter(
    folder: Path | str,
    base_path: Path | str,
    r: int,
    targets: list[str] | tuple[str, ...],
    seed: int,
    alpha: float | None = None,
) -> Path:
    """Write a PEFT LoRA adapter of rank `r` on `targets` of the model at `base_path` into
    `folder` (lora_alpha = `alpha`, else 2r); the same seed writes the same weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32)
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha if alpha is not None else 2 * r,
        target_modules=list(targets),
        init_lora_weights=False,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft asks transformers in a way it deprecates
        warnings.simplefilter("ignore", FutureWarning)
        get_peft_model(base, cfg).save_pretrained(str(folder))
    return Path(folder)
