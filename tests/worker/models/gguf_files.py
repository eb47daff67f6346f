"""Small GGUF files written as llama.cpp's converter writes them, for the loader's tests.

A random-weight Llama or Qwen2 (from a seed), its tensors quantised to the types asked for
(the gguf package quantises F16, BF16, Q8_0, Q4_0 and Q4_1; K-quant blocks are random bytes
with sane scales, since it has no K-quant quantiser), a Llama's q and k rows permuted for
llama.cpp's RoPE layout, and a byte-level BPE vocabulary with a few merges and control
tokens.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf.quants import quantize

T = gguf.GGMLQuantizationType
SHAPE = {"hidden": 256, "inter": 512, "layers": 2, "heads": 4, "kv_heads": 2}  # K-quants: 256s
# Block bytes and where the f16 scales sit, for the K-quants written as random blocks.
K_BLOCKS = {T.Q4_K: (144, (0, 2)), T.Q5_K: (176, (0, 2)), T.Q6_K: (210, (208,))}


def byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (what byte-level vocabularies store)."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    alphabet = byte_alphabet()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = ["<|endoftext|>", "<s>", "</s>", *alphabet, *merged, "<think>"]
    types = [3, 3, 3] + [1] * (len(alphabet) + len(merged)) + [4]
    return tokens, types, merges


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (HF -> GGUF)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def hf_weights(arch: str, vocab: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, inter, heads, kv = SHAPE["hidden"], SHAPE["inter"], SHAPE["heads"], SHAPE["kv_heads"]
    hd = d // heads

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    out = {"token_embd.weight": mat(vocab, d), "output_norm.weight": np.ones(d, np.float32),
           "output.weight": mat(vocab, d)}  # fmt: skip
    for i in range(SHAPE["layers"]):
        b = f"blk.{i}."
        out |= {
            b + "attn_norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            b + "ffn_norm.weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
            b + "attn_q.weight": mat(heads * hd, d), b + "attn_k.weight": mat(kv * hd, d),
            b + "attn_v.weight": mat(kv * hd, d), b + "attn_output.weight": mat(d, heads * hd),
            b + "ffn_gate.weight": mat(inter, d), b + "ffn_up.weight": mat(inter, d),
            b + "ffn_down.weight": mat(d, inter),
        }  # fmt: skip
        if arch == "qwen2":
            for name, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
                out[b + f"attn_{name}.bias"] = (0.1 * rng.standard_normal(rows)).astype(np.float32)
    return out


def encode(w: np.ndarray, kind: T, rng: np.random.Generator) -> tuple[np.ndarray, T]:
    """The tensor's bytes in `kind` (1-D tensors stay F32, as llama.cpp keeps norms)."""
    if w.ndim == 1 or kind == T.F32:
        return w, T.F32
    if kind in K_BLOCKS:
        size, scales = K_BLOCKS[kind]
        rows, cols = w.shape
        blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
        for at in scales:  # small positive f16 scales: finite, weights of a sane size
            scale = np.full((rows, cols // 256), 0.002, np.float16).view(np.uint8)
            blocks[:, :, at : at + 2] = scale.reshape(rows, cols // 256, 2)
        return blocks.reshape(rows, -1), kind
    return quantize(w, kind), kind


def write_gguf(path: Path, arch: str = "llama", kind: T = T.Q8_0, seed: int = 0,
               tokenizer: str = "gpt2", tensors: dict[str, T] | None = None) -> Path:  # fmt: skip
    """A GGUF file of a tiny random model; `tensors` overrides the type of named tensors."""
    tokens, types, merges = vocabulary()
    w = gguf.GGUFWriter(str(path), arch)
    d, heads, kv = SHAPE["hidden"], SHAPE["heads"], SHAPE["kv_heads"]
    w.add_block_count(SHAPE["layers"])
    w.add_context_length(512)
    w.add_embedding_length(d)
    w.add_feed_forward_length(SHAPE["inter"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model(tokenizer)
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    rng = np.random.default_rng(seed + 1)
    for name, weight in hf_weights(arch, len(tokens), seed).items():
        if arch == "llama" and ".attn_q." in name:
            weight = permute(weight, heads)
        elif arch == "llama" and ".attn_k." in name:
            weight = permute(weight, kv)
        data, dtype = encode(weight, (tensors or {}).get(name, kind), rng)
        w.add_tensor(name, data, raw_dtype=dtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
