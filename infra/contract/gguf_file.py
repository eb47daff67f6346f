"""GGUF files (llama.cpp's format, shared by Ollama and LM Studio) served as model folders.

A ``.gguf`` file (or a folder holding one and no ``config.json``) is converted once into an
HF-style folder in the cache: ``config.json`` from the file's metadata, ``model.safetensors``
with every tensor dequantised to float32, and ``tokenizer.json`` / ``tokenizer_config.json``
/ ``generation_config.json`` from its tokenizer metadata (infra/contract/gguf_tokenizer.py).
Everything else in Tide (the loader, the gateway's token counting, the chat template) then
reads that folder. The cache entry is keyed by the file's content (SHA-256), built in a
temporary folder and renamed into place, so processes and checkouts sharing the cache
agree and a killed conversion leaves nothing half-written in place.

Torch-free (numpy, the ``gguf`` package's reader and dequantisers): the gateway resolves
a GGUF model as the workers do. Served: the ``llama`` architecture (Llama, Mistral-style
and SmolLM files) and ``qwen2``, in the tensor types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
Q5_K and Q6_K. llama.cpp's converter stores a Llama's q and k projection rows permuted for
its RoPE layout; they are permuted back here (Qwen2 files are stored as they are). Anything
else is refused when the file is read, naming the architecture or tensor type.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from tide_fleet.infra.contract.gguf_tokenizer import tokenizer_files
from tide_fleet.infra.contract.model_config import ModelLoadError

try:
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import save_file
except ImportError:  # an engine-only install: GGUF files are refused with the package named
    HAS_GGUF = False
else:
    HAS_GGUF = True

GGUF_FORMAT = 1  # bump when the converted folder changes, so stale entries are rebuilt
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_path(model: str | Path) -> Path | None:
    """The GGUF file a model name refers to: a ``.gguf`` path, or the one ``.gguf`` file of
    a folder without ``config.json``; None for anything else."""
    path = Path(model)
    if path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        files = sorted(path.glob("*.gguf"))
        if len(files) > 1:
            names = ", ".join(f.name for f in files)
            raise ModelLoadError(f"{path} holds several GGUF files ({names}): name one")
        return files[0] if files else None
    return None


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()[:24]


def gguf_folder(path: Path, cache: Path) -> Path:
    """The converted folder for a GGUF file, built once per file content."""
    if not path.is_file():
        raise ModelLoadError(f"no such GGUF file: {path}")
    st = path.stat()
    key = _digest(str(path.resolve()), st.st_size, st.st_mtime_ns)
    target = cache / "gguf" / f"{path.stem}-{key}-v{GGUF_FORMAT}"
    if (target / "model.safetensors").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=target.parent))
    try:
        convert(path, tmp)
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert(path: Path, out: Path) -> None:
    """Write the HF-style folder for the GGUF file at `path` into `out`."""
    if not HAS_GGUF:
        raise ModelLoadError("GGUF files need the gguf package (pip install 'gguf>=0.17')")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise ModelLoadError(f"{path} is not a GGUF file Tide can read: {e}") from None
    meta = {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("tokenizer.ggml.")}  # fmt: skip
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{path.name}: GGUF architecture {arch!r} is not one Tide serves "
            f"({', '.join(ARCHITECTURES)})"
        )
    for t in reader.tensors:
        if t.tensor_type.name not in TENSOR_TYPES:
            raise ModelLoadError(
                f"{path.name}: tensor {t.name} is of type {t.tensor_type.name}, which Tide does "
                f"not dequantise (it reads {', '.join(TENSOR_TYPES)})"
            )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ModelLoadError(
            f"{path.name}: per-dimension RoPE frequencies (rope_freqs, Llama 3.1-style scaling "
            "in GGUF form) are not supported; use the model's HF folder"
        )
    tokenizer, tok_config, generation = tokenizer_files(reader)
    config = hf_config(meta, arch, tied="output.weight" not in names,
                       vocab_size=len(tokenizer.get_vocab(with_added_tokens=True)))  # fmt: skip
    config |= {k: v for k, v in generation.items() if k in ("bos_token_id", "eos_token_id")}
    save_file(weights(reader, config, arch), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(generation, indent=1))
    (out / "source.json").write_text(json.dumps({"gguf": str(path.resolve())}))


def hf_config(meta: dict[str, Any], arch: str, tied: bool, vocab_size: int) -> dict[str, Any]:
    """The HF config of the model the metadata describes."""

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata lacks {arch}.{key}")
        return value

    heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelLoadError(f"GGUF RoPE scaling {scaling!r} is not supported")
    return {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length")),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }


def weights(reader: Any, config: dict[str, Any], arch: str) -> dict[str, np.ndarray]:
    """Every tensor under its HF name, dequantised to float32; a Llama's q and k rows back
    in HF order."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            raise ModelLoadError(f"GGUF tensor {t.name} has no place in a {arch} model")
        shape = [int(n) for n in reversed(t.shape)]  # GGUF lists dimensions innermost first
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape(shape)
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = unpermute(w, heads)
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = unpermute(w, kv_heads)
        out[name] = np.ascontiguousarray(w)
    return out


def hf_name(name: str) -> str | None:
    if name in TOP_TENSORS:
        return TOP_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    return None


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: its rows hold each head's rotary pairs as
    (even, odd) interleaved; HF's hold the first halves, then the second halves."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
