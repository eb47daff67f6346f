"""Llama-family models with random N(0, 0.02) weights built directly on a device, at real
models' shapes (Llama-3-8B, Qwen2.5-7B) or a tiny one: what ``scripts/gpu_check.py``
measures on a GPU without a download, and what the device-placement tests build on CPU."""

from __future__ import annotations

from typing import Any

import torch

from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.kernels.linear import Linear
from tide_fleet.worker.models.llama import LayerWeights, LlamaModel

SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                      max_position_embeddings=8192, rope_theta=500000.0),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                       max_position_embeddings=32768, rope_theta=1000000.0, qkv_bias=True),
    "tiny": dict(vocab_size=260, hidden_size=64, intermediate_size=128, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=2048),
}  # fmt: skip


def build_random_model(
    shape: dict[str, Any], device: torch.device, dtype: torch.dtype
) -> LlamaModel:
    """A LlamaModel of this shape with N(0, 0.02) weights made on the device (empty on meta)."""
    cfg = ModelConfig(architecture="LlamaForCausalLM", eos_token_ids=[2], **shape)
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(0)

    def mat(*size: int) -> torch.Tensor:
        if gen is None:
            return torch.empty(size, dtype=dtype, device=device)
        return torch.randn(size, generator=gen, dtype=dtype, device=device).mul_(0.02)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    d, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_heads * hd, cfg.num_kv_heads * hd
    layers = [
        LayerWeights(
            input_norm=ones(d),
            qkv=Linear(mat(q + 2 * kv, d), mat(q + 2 * kv) if cfg.qkv_bias else None),
            o=Linear(mat(d, q)),
            post_norm=ones(d),
            gate_up=Linear(mat(2 * inter, d)),
            down=Linear(mat(d, inter)),
        )
        for _ in range(cfg.num_layers)
    ]
    return LlamaModel(cfg, mat(cfg.vocab_size, d), layers, ones(d), Linear(mat(cfg.vocab_size, d)))
