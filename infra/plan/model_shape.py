"""Model shapes for planning: the few numbers of a Llama-family decoder that decide its memory.

Torch-free. Read from a Hugging Face ``config.json`` or from PRESETS (real shapes of common
models). The engine's own loader is infra/contract/model_config.py; this one needs no weights and
accepts any config that has the shape fields. What a step costs (FLOPs, bytes) is in
roofline.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1, "int8": 1}


class ShapeError(ValueError):
    """A preset, config.json or dtype the planner cannot read; the message says which field."""


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ShapeError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


class Dims(Protocol):
    """The shape fields the costs need: ModelShape has them, and so has the engine's
    ModelConfig (infra/contract/model_config.py)."""

    @property
    def num_layers(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...


def projection_parameters(dims: Dims) -> int:
    """Weights of every layer's projections (q/k/v, o, gate/up/down), biases and norms aside."""
    d, q, kv = dims.hidden_size, dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    return dims.num_layers * (d * (q + 2 * kv) + q * d + 3 * d * dims.intermediate_size)


_HF_FIELDS = {  # ModelShape field -> config.json key; the first five are required
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_heads": "num_attention_heads",
    "vocab_size": "vocab_size",
    "num_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "max_position_embeddings": "max_position_embeddings",
}


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a Llama-family decoder: all the planner needs to know of a model."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 4096
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ShapeError(f"{self.name}: {f.name} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ShapeError(
                f"{self.name}: num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    def tensor_parallel_sizes(self, up_to: int | None = None) -> list[int]:
        """The tensor parallel sizes this model splits into: those that divide both head
        counts (the KV heads divide the attention heads, so the KV heads' divisors)."""
        top = self.num_kv_heads if up_to is None else min(up_to, self.num_kv_heads)
        return [n for n in range(1, top + 1) if self.num_kv_heads % n == 0]

    def _check_tensor_parallel(self, n: int) -> None:
        if n < 1 or self.num_kv_heads % n:
            raise ShapeError(
                f"{self.name}: tensor parallel size {n} must divide the heads "
                f"({self.num_heads} attention, {self.num_kv_heads} KV)"
            )

    def num_parameters(self, tensor_parallel_size: int = 1) -> int:
        """Every weight, or one GPU's shard of them when the model is split `tensor_parallel_size`
        ways: q/k/v/o by heads, the MLP by its intermediate size, the embedding and the LM head
        by vocabulary (rounded up); the norms are replicated on every GPU."""
        n = tensor_parallel_size
        self._check_tensor_parallel(n)
        d, q, kv = (
            self.hidden_size,
            self.num_heads * self.head_dim // n,
            self.num_kv_heads * self.head_dim // n,
        )
        inter = -(-self.intermediate_size // n)
        bias = (q + 2 * kv) if self.qkv_bias else 0
        per_layer = d * (q + 2 * kv) + q * d + 3 * d * inter + bias + 2 * d  # + two RMSNorms
        embed = self._vocab_shard(n) * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + d

    def _vocab_shard(self, n: int) -> int:
        return -(-self.vocab_size // n)

    def streamed_parameters(self, tensor_parallel_size: int = 1) -> int:
        """Parameters a decode step reads (per GPU when split): an untied input embedding is
        only looked up."""
        n = tensor_parallel_size
        lookup_only = 0 if self.tie_word_embeddings else self._vocab_shard(n) * self.hidden_size
        return self.num_parameters(n) - lookup_only

    def weight_bytes(self, dtype: str, tensor_parallel_size: int = 1) -> int:
        return self.num_parameters(tensor_parallel_size) * dtype_bytes(dtype)

    def kv_bytes_per_token(self, kv_dtype: str, tensor_parallel_size: int = 1) -> int:
        """K and V of one token, all layers; split N ways each GPU holds its heads' share."""
        self._check_tensor_parallel(tensor_parallel_size)
        kv_heads = self.num_kv_heads // tensor_parallel_size
        return 2 * self.num_layers * kv_heads * self.head_dim * dtype_bytes(kv_dtype)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_preset(cls, name: str) -> ModelShape:
        key = name.strip().lower()
        if key not in PRESETS:
            raise ShapeError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
        return PRESETS[key]

    @classmethod
    def from_hf_config(cls, raw: dict[str, Any], source: str = "config.json") -> ModelShape:
        """Read the shapes from a Hugging Face config dict; errors name source and field."""
        if not isinstance(raw, dict):
            raise ShapeError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        missing = [repr(k) for k in list(_HF_FIELDS.values())[:5] if raw.get(k) is None]
        if missing:
            s = "s" if len(missing) > 1 else ""
            raise ShapeError(f"{source}: missing field{s} {', '.join(missing)}")
        values: dict[str, Any] = {}
        for attr, key in _HF_FIELDS.items():
            v = raw.get(key)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ShapeError(f"{source}: field {key!r} must be a positive integer, got {v!r}")
            values[attr] = v
        values.setdefault("num_kv_heads", values["num_heads"])
        values.setdefault("head_dim", values["hidden_size"] // values["num_heads"])
        archs = raw.get("architectures") or []
        is_qwen2 = "Qwen2ForCausalLM" in archs or raw.get("model_type") == "qwen2"
        return cls(
            **values,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or bool(raw.get("attention_bias", False)),
            name=source,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelShape:
        """A config.json, or a model folder holding one."""
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise ShapeError(f"missing file: {p}")
        try:
            raw = json.loads(p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ShapeError(f"{p}: not valid JSON ({e})") from None
        return cls.from_hf_config(raw, source=str(p))


def _preset(name: str, *shape: int, tied: bool = False, bias: bool = False) -> ModelShape:
    layers, hidden, inter, heads, kv_heads, head_dim, vocab, context = shape
    return ModelShape(
        layers, hidden, inter, heads, kv_heads, head_dim, vocab, tied, bias, context, name=name
    )


# layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, context (from each config.json)
PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        _preset("llama-2-7b", 32, 4096, 11008, 32, 32, 128, 32000, 4096),
        _preset("llama-2-13b", 40, 5120, 13824, 40, 40, 128, 32000, 4096),
        _preset("llama-3-8b", 32, 4096, 14336, 32, 8, 128, 128256, 8192),
        _preset("llama-3-70b", 80, 8192, 28672, 64, 8, 128, 128256, 8192),
        _preset("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 128256, 131072),
        _preset("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 128256, 131072),
        _preset("llama-3.2-1b", 16, 2048, 8192, 32, 8, 64, 128256, 131072, tied=True),
        _preset("mistral-7b", 32, 4096, 14336, 32, 8, 128, 32000, 32768),
        _preset("qwen2-7b", 28, 3584, 18944, 28, 4, 128, 152064, 32768, bias=True),
        _preset("qwen2-0.5b", 24, 896, 4864, 14, 2, 64, 151936, 32768, tied=True, bias=True),
    )
}


def load_shape(model: str) -> ModelShape:
    """A preset name, or a path to a config.json (or to the folder that holds one)."""
    if model.strip().lower() in PRESETS:
        return ModelShape.from_preset(model)
    if "/" in model or model.endswith(".json") or Path(model).exists():
        return ModelShape.from_file(model)
    return ModelShape.from_preset(model)  # raises, listing the presets


def kv_bytes(shape: ModelShape, seq_len: int, batch: int = 1, kv_dtype: str = "bfloat16") -> int:
    """KV cache bytes of `batch` sequences of `seq_len` tokens each."""
    return shape.kv_bytes_per_token(kv_dtype) * seq_len * batch
