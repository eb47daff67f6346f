"""Load a Hugging Face checkpoint folder (or a ``dummy:<preset>``) into a LlamaModel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from tide_fleet.infra.contract.model_config import ModelConfig, ModelLoadError
from tide_fleet.kernels.linear import Linear
from tide_fleet.worker.models.llama import LayerWeights, LlamaModel
from tide_fleet.worker.parallel.group import TensorParallel
from tide_fleet.worker.parallel.shard import ShardLayout, check_divides

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

    def get(
        self, name: str, shape: tuple[int, ...], part: tuple[int, int, int] | None = None
    ) -> torch.Tensor:
        """The tensor, or only its ``part`` (dim, start, stop): read from the file as a
        slice, so a rank never holds the whole tensor."""
        if name not in self.weight_map:
            raise ModelLoadError(f"missing tensor {name!r} in the checkpoint")
        sliced = self.handles[self.weight_map[name]].get_slice(name)
        if tuple(sliced.get_shape()) != shape:
            raise ModelLoadError(
                f"shape mismatch for {name!r}: checkpoint has {tuple(sliced.get_shape())}, "
                f"config expects {shape}"
            )
        if part is None:
            return sliced[:]
        dim, start, stop = part
        return sliced[(slice(None),) * dim + (slice(start, stop),)]


def load_model(
    path: str | Path, dtype: str | None = None, device: str = "auto",
    tp: TensorParallel | None = None,
) -> LlamaModel:  # fmt: skip
    """The model in ``path``; with ``tp``, only this rank's shard of it
    (worker/parallel/shard.py), on ``tp.device``."""
    folder = Path(path)
    if not folder.is_dir():
        raise ModelLoadError(f"model folder not found: {folder}")
    config = ModelConfig.from_folder(folder)
    dev = resolve_device(device) if tp is None else tp.device
    torch_dtype = resolve_dtype(dtype, config, dev)
    layout = None
    if tp is not None:
        check_divides(config, tp.world)
        layout = ShardLayout(config, tp.shard)
    with ExitStack() as stack:
        src = _TensorSource(folder, stack)
        return _build(config, src, torch_dtype, dev, layout, tp)


def _build(
    cfg: ModelConfig, src: _TensorSource, dtype: torch.dtype, device: torch.device,
    layout: ShardLayout | None = None, tp: TensorParallel | None = None,
) -> LlamaModel:  # fmt: skip
    d, hd = cfg.hidden_size, cfg.head_dim
    q, kv, inter = cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.intermediate_size
    # Split dimensions (dim, start, stop) of this rank's parts; None: whole tensors.
    parts: dict[str, tuple[int, int]] = {}
    if layout is not None:
        parts = {"q": layout.q_rows(), "kv": layout.kv_rows(), "mlp": layout.mlp_rows()}

    def get(name: str, *shape: int, split: str | None = None, dim: int = 0) -> torch.Tensor:
        part = None if split not in parts else (dim, *parts[split])
        return src.get(name, shape, part).to(device=device, dtype=dtype).contiguous()

    def cat(names: list[str], shapes: list[tuple[int, ...]], splits: list[str]) -> torch.Tensor:
        return torch.cat([
            get(n, *s, split=p) for n, s, p in zip(names, shapes, splits, strict=True)
        ]).contiguous()  # fmt: skip

    def row_bias(name: str) -> torch.Tensor | None:  # o's, down's: added once, by rank 0
        return get(name, d) if layout is None or layout.adds_row_bias else None

    def layers() -> Iterator[LayerWeights]:
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            qkv_names = [a + "q_proj", a + "k_proj", a + "v_proj"]
            gate_up = [m + "gate_proj", m + "up_proj"]
            heads = ["q", "kv", "kv"]
            yield LayerWeights(
                input_norm=get(p + "input_layernorm.weight", d),
                qkv=Linear(
                    cat([n + ".weight" for n in qkv_names], [(q, d), (kv, d), (kv, d)], heads),
                    cat([n + ".bias" for n in qkv_names], [(q,), (kv,), (kv,)], heads)
                    if cfg.qkv_bias
                    else None,
                ),
                o=Linear(
                    get(a + "o_proj.weight", d, q, split="q", dim=1),
                    row_bias(a + "o_proj.bias") if cfg.o_bias else None,
                ),
                post_norm=get(p + "post_attention_layernorm.weight", d),
                gate_up=Linear(
                    cat([n + ".weight" for n in gate_up], [(inter, d)] * 2, ["mlp"] * 2),
                    cat([n + ".bias" for n in gate_up], [(inter,)] * 2, ["mlp"] * 2)
                    if cfg.mlp_bias
                    else None,
                ),
                down=Linear(
                    get(m + "down_proj.weight", d, inter, split="mlp", dim=1),
                    row_bias(m + "down_proj.bias") if cfg.mlp_bias else None,
                ),
            )

    def vocab(name: str) -> torch.Tensor:
        """The embedding or lm_head: whole, or this rank's rows padded to the shard size."""
        if layout is None:
            return get(name, cfg.vocab_size, d)
        start, stop = layout.vocab_range()
        rows = src.get(name, (cfg.vocab_size, d), (0, start, stop)).to(device=device, dtype=dtype)
        return F.pad(rows, (0, 0, 0, layout.vocab_rows - (stop - start))).contiguous()

    embed = vocab("model.embed_tokens.weight")
    tied = cfg.tie_word_embeddings
    lm_head = Linear(embed if tied else vocab("lm_head.weight"))
    local = cfg if layout is None else layout.local_config
    norm = get("model.norm.weight", d)
    return LlamaModel(local, embed, list(layers()), norm, lm_head, tp)
