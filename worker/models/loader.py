"""Load a Hugging Face checkpoint folder (or a ``dummy:<preset>``) into a LlamaModel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from tide_fleet.infra.contract.model_config import ModelConfig, ModelLoadError
from tide_fleet.kernels.linear import Linear
from tide_fleet.worker.models.llama import LayerWeights, LlamaModel

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for but no CUDA device is available")
    if device not in ("cpu", "cuda"):
        raise ModelLoadError(f"unknown device {device!r}; choose auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(name: str | None, config: ModelConfig, device: torch.device) -> torch.dtype:
    """An explicit dtype wins; otherwise (None or "auto") bfloat16 where the hardware
    computes in it and the nearest fast type where it does not: on CUDA bfloat16, or
    float16 on a GPU without it; on CPU bfloat16 with AVX-512 BF16 or AMX, else float32
    (on AVX2 alone oneDNN's bf16 matmuls run several times slower than float32).

    A float16 or float32 checkpoint loads fine as bfloat16; pass float32 for exact
    reference comparisons.
    """
    if name is None or name == "auto":
        return native_dtype(device)
    if name not in DTYPES:
        raise ModelLoadError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


def native_dtype(device: torch.device) -> torch.dtype:
    """The 16-bit type the device is fast in, or float32 where it has none."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return torch.bfloat16
    return torch.float32


class _TensorSource:
    """Tensors by name across one safetensors file or a sharded index."""

    def __init__(self, folder: Path, stack: ExitStack) -> None:
        index = folder / "model.safetensors.index.json"
        single = folder / "model.safetensors"
        if index.is_file():
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
        elif single.is_file():
            shards = ["model.safetensors"]
            weight_map = {}
        else:
            raise ModelLoadError(f"missing weights in {folder}: need {single.name} or {index.name}")
        self.handles = {}
        for shard in shards:
            path = folder / shard
            if not path.is_file():
                raise ModelLoadError(f"missing weight shard named by the index: {path}")
            self.handles[shard] = stack.enter_context(safe_open(str(path), framework="pt"))
        if not weight_map:
            weight_map = {k: shards[0] for k in self.handles[shards[0]].keys()}  # noqa: SIM118
        self.weight_map = weight_map

    def has(self, name: str) -> bool:
        return name in self.weight_map

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.weight_map:
            raise ModelLoadError(f"missing tensor {name!r} in the checkpoint")
        tensor = self.handles[self.weight_map[name]].get_tensor(name)
        if tuple(tensor.shape) != shape:
            raise ModelLoadError(
                f"shape mismatch for {name!r}: checkpoint has {tuple(tensor.shape)}, "
                f"config expects {shape}"
            )
        return tensor


def load_model(path: str | Path, dtype: str | None = None, device: str = "auto") -> LlamaModel:
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"model folder not found: {folder}")
    config = ModelConfig.from_folder(folder)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, config, dev)
    with ExitStack() as stack:
        src = _TensorSource(folder, stack)
        return _build(config, src, torch_dtype, dev)


def _build(
    cfg: ModelConfig, src: _TensorSource, dtype: torch.dtype, device: torch.device
) -> LlamaModel:
    d, hd = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.intermediate_size

    def get(name: str, *shape: int) -> torch.Tensor:
        return src.get(name, shape).to(device=device, dtype=dtype).contiguous()

    def cat(names: list[str], shapes: list[tuple[int, ...]]) -> torch.Tensor:
        return torch.cat([get(n, *s) for n, s in zip(names, shapes, strict=True)]).contiguous()

    def layers() -> Iterator[LayerWeights]:
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            qkv_names = [a + "q_proj", a + "k_proj", a + "v_proj"]
            gate_up = [m + "gate_proj", m + "up_proj"]
            yield LayerWeights(
                input_norm=get(p + "input_layernorm.weight", d),
                qkv=Linear(
                    cat([n + ".weight" for n in qkv_names], [(q, d), (kv, d), (kv, d)]),
                    cat([n + ".bias" for n in qkv_names], [(q,), (kv,), (kv,)])
                    if cfg.qkv_bias
                    else None,
                ),
                o=Linear(
                    get(a + "o_proj.weight", d, q),
                    get(a + "o_proj.bias", d) if cfg.o_bias else None,
                ),
                post_norm=get(p + "post_attention_layernorm.weight", d),
                gate_up=Linear(
                    cat([n + ".weight" for n in gate_up], [(inter, d)] * 2),
                    cat([n + ".bias" for n in gate_up], [(inter,)] * 2) if cfg.mlp_bias else None,
                ),
                down=Linear(
                    get(m + "down_proj.weight", d, inter),
                    get(m + "down_proj.bias", d) if cfg.mlp_bias else None,
                ),
            )

    embed = get("model.embed_tokens.weight", cfg.vocab_size, d)
    tied = cfg.tie_word_embeddings
    lm_head = Linear(embed if tied else get("lm_head.weight", cfg.vocab_size, d))
    return LlamaModel(cfg, embed, list(layers()), get("model.norm.weight", d), lm_head)
