"""LoRA adapters in PEFT's format, read and checked against their base model.

An adapter is a folder (or an ``s3://bucket/prefix`` fetched once into the cache) holding
``adapter_config.json`` and ``adapter_model.safetensors``, as ``peft``'s ``save_pretrained``
writes them. Tide applies adapters to the attention and MLP projections: ``q_proj``,
``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``, ``down_proj`` and the fused
``qkv_proj`` and ``gate_up_proj``, ranks up to ``MAX_RANK``; each module's scaling is
``lora_alpha / r`` (``/ sqrt(r)`` with ``use_rslora``), ``rank_pattern`` and
``alpha_pattern`` included. Anything else (DoRA, trained biases, ``modules_to_save``, an
embedding or lm_head adapter, a shape that does not fit the base) is refused here, when the
adapter is loaded, with the field or tensor and the limit named.

Torch-free: the gateway checks an adapter an operator loads as the workers do (the shapes
come from the safetensors header, no tensor is read).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open

from tide_fleet.infra.contract.model_config import ModelConfig

MAX_RANK = 64
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# PEFT module name -> Tide's. The fused forms (Phi-3 style) span their projection's output.
MODULES = {
    "q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "qkv_proj": "qkv",
    "gate_proj": "gate", "up_proj": "up", "down_proj": "down", "gate_up_proj": "gate_up",
}  # fmt: skip
_KEY = re.compile(
    r"^(?:.*\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$"
)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


class AdapterError(ValueError):
    """An adapter that cannot be served on its base, the reason named."""


@dataclass(frozen=True)
class ModuleLora:
    """One module's low-rank pair in one layer: A [rank, in], B [out, rank]."""

    layer: int
    module: str  # Tide's name: q, k, v, o, qkv, gate, up, down, gate_up
    rank: int
    scaling: float
    key_a: str
    key_b: str


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: where its files are and what it changes."""

    name: str
    folder: Path
    rank: int  # the largest module rank
    modules: tuple[ModuleLora, ...]
    base_model: str | None  # base_model_name_or_path, as the adapter says

    @property
    def targets(self) -> list[str]:
        return sorted({m.module for m in self.modules})

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "targets": self.targets,
                "base_model": self.base_model}  # fmt: skip


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise AdapterError(
            f"adapter name {name!r}: 1 to 128 characters of letters, digits and ._:/-, "
            "starting with a letter or digit"
        )
    return name


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every projection an adapter may target, on this base."""
    h, inter = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    return {
        "q": (h, q), "k": (h, kv), "v": (h, kv), "qkv": (h, q + 2 * kv), "o": (q, h),
        "gate": (h, inter), "up": (h, inter), "gate_up": (h, 2 * inter), "down": (inter, h),
    }  # fmt: skip


def adapter_folder(path: str, cache_dir: Path | None = None) -> Path:
    """The local folder of an adapter: a folder as is; an ``s3://bucket/prefix`` fetched
    once into ``cache_dir``/adapters (built aside and renamed into place)."""
    if not path.startswith("s3://"):
        return Path(path)
    if cache_dir is None:
        raise AdapterError(f"adapter path {path!r}: an s3:// adapter needs a cache folder")
    key = hashlib.sha256(path.encode()).hexdigest()[:24]
    target = cache_dir / "adapters" / key
    if (target / WEIGHTS_FILE).is_file():
        return target
    bucket, _, prefix = path[len("s3://") :].partition("/")
    import boto3  # the AWS extra; only an s3:// adapter needs it
    from botocore.exceptions import BotoCoreError, ClientError

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
    try:
        s3 = boto3.client("s3")
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            s3.download_file(bucket, f"{prefix.rstrip('/')}/{name}".lstrip("/"), str(tmp / name))
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    except (BotoCoreError, ClientError) as e:
        raise AdapterError(f"adapter path {path!r}: cannot fetch it from S3: {e}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_adapter(
    name: str, path: str, config: ModelConfig, cache_dir: Path | None = None,
    max_rank: int = MAX_RANK,
) -> AdapterSpec:  # fmt: skip
    """Read and check the adapter at `path` against the base `config`; AdapterError names
    what does not fit."""
    check_name(name)
    folder = adapter_folder(path, cache_dir)
    cfg = _read_config(folder, path)
    _refuse_unsupported(cfg, path)
    try:
        with safe_open(str(folder / WEIGHTS_FILE), "np") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    except OSError as e:
        raise AdapterError(f"adapter {path!r}: cannot read {WEIGHTS_FILE}: {e}") from None
    except Exception as e:  # safetensors raises its own error type for a bad header
        raise AdapterError(
            f"adapter {path!r}: {WEIGHTS_FILE} is not a safetensors file: {e}"
        ) from None
    modules = _modules(shapes, cfg, config, path, max_rank)
    rank = max(m.rank for m in modules)
    base = cfg.get("base_model_name_or_path")
    return AdapterSpec(name, folder, rank, tuple(modules), base if isinstance(base, str) else None)


def _read_config(folder: Path, path: str) -> dict[str, Any]:
    try:
        raw = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise AdapterError(f"adapter {path!r}: no {CONFIG_FILE} in {folder}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"adapter {path!r}: {CONFIG_FILE} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise AdapterError(f"adapter {path!r}: {CONFIG_FILE} must hold a JSON object")
    if not (folder / WEIGHTS_FILE).is_file():
        raise AdapterError(f"adapter {path!r}: no {WEIGHTS_FILE} in {folder}")
    return raw


def _refuse_unsupported(cfg: dict[str, Any], path: str) -> None:
    if cfg.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"adapter {path!r}: peft_type {cfg['peft_type']!r}; Tide serves LORA")
    refused = {
        "use_dora": "DoRA adapters are not served",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D weights) is not served",
        "lora_bias": "trained LoRA biases are not served",
        "modules_to_save": "modules_to_save (fully trained layers) are not served",
        "layer_replication": "layer_replication is not served",
        "target_parameters": "target_parameters is not served",
        "trainable_token_indices": "trainable_token_indices is not served",
        "alora_invocation_tokens": "activated LoRA is not served",
    }
    for field, why in refused.items():
        if cfg.get(field):
            raise AdapterError(f"adapter {path!r}: {field}: {why}")
    if cfg.get("bias", "none") != "none":
        raise AdapterError(f"adapter {path!r}: bias {cfg['bias']!r}: only 'none' is served")


def _pattern_value(patterns: dict[str, Any], module_path: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern lookup: a key matching the module's full name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module_path):
            return value
    return default


def _modules(
    shapes: dict[str, tuple[int, ...]], cfg: dict[str, Any], config: ModelConfig, path: str,
    max_rank: int,
) -> list[ModuleLora]:  # fmt: skip
    expected = module_shapes(config)
    pairs: dict[tuple[int, str], dict[str, str]] = {}
    for key in shapes:
        m = _KEY.match(key)
        if m is None or m.group(2) not in MODULES:
            raise AdapterError(
                f"adapter {path!r}: tensor {key!r} is not on a projection Tide adapts "
                f"({', '.join(MODULES)})"
            )
        layer = int(m.group(1))
        if layer >= config.num_layers:
            raise AdapterError(
                f"adapter {path!r}: tensor {key!r} is for layer {layer}; the base has "
                f"{config.num_layers} layers"
            )
        pairs.setdefault((layer, MODULES[m.group(2)]), {})[m.group(3)] = key
    if not pairs:
        raise AdapterError(f"adapter {path!r}: {WEIGHTS_FILE} holds no LoRA tensors")
    fused = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
    rslora, alpha = bool(cfg.get("use_rslora")), cfg.get("lora_alpha", 8)
    out = []
    for (layer, module), keys in sorted(pairs.items()):
        if set(keys) != {"A", "B"}:
            missing = "lora_B" if "A" in keys else "lora_A"
            raise AdapterError(f"adapter {path!r}: layer {layer} {module}: no {missing} tensor")
        for whole, parts in fused.items():
            if module == whole and any((layer, p) in pairs for p in parts):
                raise AdapterError(
                    f"adapter {path!r}: layer {layer} has both {whole} and one of its parts"
                )
        a, b = shapes[keys["A"]], shapes[keys["B"]]
        n_in, n_out = expected[module]
        rank = a[0] if len(a) == 2 else -1
        if len(a) != 2 or len(b) != 2 or a[1] != n_in or b != (n_out, rank):
            raise AdapterError(
                f"adapter {path!r}: layer {layer} {module}: lora_A {list(a)} and lora_B "
                f"{list(b)} do not fit the base: expected lora_A [r, {n_in}] and lora_B "
                f"[{n_out}, r]"
            )
        if not 1 <= rank <= max_rank:
            raise AdapterError(
                f"adapter {path!r}: layer {layer} {module}: rank {rank} is over the limit "
                f"of {max_rank}"
            )
        full = keys["A"].rsplit(".lora_A", 1)[0]
        mod_alpha = float(_pattern_value(cfg.get("alpha_pattern") or {}, full, alpha))
        scaling = mod_alpha / (math.sqrt(rank) if rslora else rank)
        out.append(ModuleLora(layer, module, rank, scaling, keys["A"], keys["B"]))
    return out
