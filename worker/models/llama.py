"""Llama-family decoder (Llama, Mistral, Qwen2) over a flattened batch of tokens.

Weights are plain tensors, fused at load time (q|k|v and gate|up) so each layer runs
four matmuls. Attention goes through ``kernels`` so the paged KV cache and the
Triton path stay behind one signature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import AttentionMetadata, paged_attention, write_kv_cache
from worker.models.config import ModelConfig
from worker.models.rope import RotaryEmbedding, apply_rotary


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        embed: torch.Tensor,
        layers: list[LayerWeights],
        norm: torch.Tensor,
        lm_head: torch.Tensor,
    ) -> None:
        self.config = config
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.dtype = embed.dtype
        self.device = embed.device
        self.rope = RotaryEmbedding(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            self.dtype,
            self.device,
        )
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_heads * config.head_dim
        self.kv_size = config.num_kv_heads * config.head_dim

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run the step's tokens; return float32 logits for the rows in logits_indices."""
        cfg = self.config
        cos, sin = self.rope.tables(positions)
        hidden = F.embedding(input_ids, self.embed)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x = rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = apply_rotary(q.view(-1, cfg.num_heads, cfg.head_dim), cos, sin)
            k = apply_rotary(k.view(-1, cfg.num_kv_heads, cfg.head_dim), cos, sin)
            v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
            write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
            attn = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
            hidden = hidden + F.linear(attn.reshape(-1, self.q_size), layer.o, layer.o_bias)
            x = rms_norm(hidden, layer.post_norm, cfg.rms_norm_eps)
            gate, up = F.linear(x, layer.gate_up, layer.gate_up_bias).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down, layer.down_bias)
        hidden = rms_norm(hidden[logits_indices], self.norm, cfg.rms_norm_eps)
        return F.linear(hidden, self.lm_head).float()
