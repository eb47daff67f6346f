"""Model shape and options, read from a Hugging Face ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


class ModelLoadError(ValueError):
    """A checkpoint folder that Tide cannot load; the message says what and where."""


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None
    torch_dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @property
    def max_model_len(self) -> int:
        """Context the engine allows: positions, capped by a sliding window it does not model."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    def num_parameters(self) -> int:
        d, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim,
            self.num_kv_heads * self.head_dim,
        )
        per_layer = d * (q + 2 * kv) + q * d + 3 * d * self.intermediate_size + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + d

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        archs = raw.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ModelLoadError(
                f"unsupported architecture {archs or raw.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            rope = raw.get("rope_scaling") or raw.get("rope_parameters") or None
            theta = raw.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
            eos = raw.get("eos_token_id")
            sliding = raw.get("sliding_window")
            if arch == "Qwen2ForCausalLM" and not raw.get("use_sliding_window", False):
                sliding = None
            return cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(theta),
                rope_scaling=_rope_scaling(rope),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
                o_bias=arch != "Qwen2ForCausalLM" and bool(raw.get("attention_bias", False)),
                mlp_bias=bool(raw.get("mlp_bias", False)),
                sliding_window=int(sliding) if sliding else None,
                torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            )
        except KeyError as e:
            raise ModelLoadError(f"config.json is missing the field {e.args[0]!r}") from None

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        path = folder / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"missing file: {path}")
        return cls.from_dict(json.loads(path.read_text()))


def _rope_scaling(rope: dict[str, Any] | None) -> dict[str, Any] | None:
    if not rope:
        return None
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise ModelLoadError(f"unsupported rope_scaling type {kind!r}; supported: llama3")
    return dict(rope, rope_type="llama3")
