"""The kernel table: which implementation serves each op on each hardware class, and why,
and what else each op may be forced to (``kernels/dispatch.py`` resolves it per device and
applies the forces).

Hardware classes: ``cuda``; on CPU what the native build runs on (``cpu.isa()``):
``cpu-amx``, ``cpu-avx512bf16``, ``cpu-avx512`` (no bf16 dot product), ``cpu-avx2``,
``cpu-generic`` (portable C++ loops), ``cpu-no-native`` (no compiler, ``TIDE_CPU_KERNELS=0``,
or an install without Tide's settings). ``markdown()`` renders the table as
docs/architecture.md shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

FORCE_VAR = "TIDE_KERNELS"
OPS = ("gemv", "gemm", "decode_attention", "prefill_attention", "norm", "rope", "activation",
       "kv_write", "sampling", "lora")  # fmt: skip
CLASSES = ("cuda", "cpu-amx", "cpu-avx512bf16", "cpu-avx512", "cpu-avx2", "cpu-generic",
           "cpu-no-native")  # fmt: skip
PAIRS = ("cpu-amx", "cpu-avx512bf16")  # a bf16 dot product (tdpbf16ps, vdpbf16ps)
LOOPS = ("cpu-avx512", "cpu-avx2", "cpu-generic")  # native kernels, no bf16 dot product
NATIVE = (*PAIRS, *LOOPS)
NO_PAIRS = (*LOOPS, "cpu-no-native")
CPU_CLASSES = (*NATIVE, "cpu-no-native")


@dataclass(frozen=True)
class Choice:
    impl: str
    reason: str


def _cells(*groups: tuple[tuple[str, ...], str, str]) -> dict[str, Choice]:
    return {cls: Choice(impl, reason) for classes, impl, reason in groups for cls in classes}


# fmt: off
TABLE: dict[str, dict[str, Choice]] = {
    "gemv": _cells(
        (("cuda",), "gemm", "no separate GEMV: cuBLAS (F.linear) takes every row count"),
        (("cpu-amx",), "cpp-amx", "bf16 on AMX tiles up to 40 rows a step, the weight read at "
         "about the plain read rate: 1.2-1.7x oneDNN (scripts/bench_gemv.py)"),
        (("cpu-avx512bf16",), "cpp-avx512bf16", "bf16 batch 1-2 on vdpbf16ps, a weight copy "
         "beside oneDNN's (scripts/bench_gemv.py)"),
        (NO_PAIRS, "gemm", "no bf16 dot product: the gemm row takes every row count"),
    ),
    "gemm": _cells(
        (("cuda",), "torch", "F.linear (cuBLAS)"),
        (("cpu-amx",), "cpp-amx", "bf16 on AMX tiles over the GEMV's weight, unpadded: 1.4-1.8x "
         "oneDNN at 96 rows, level at 256-1,024 (scripts/bench_gemm.py); float32: onednn"),
        (("cpu-avx512bf16", "cpu-avx512", "cpu-generic", "cpu-no-native"), "onednn",
         "oneDNN's packed matmul at fixed row buckets built at load: about 1.3x F.linear"),
        (("cpu-avx2",), "cpp-avx2", "float32 on Tide's AVX2+FMA GEMM: 1.1-2.3x oneDNN at 1-64 "
         "rows, level past 256 (scripts/bench_gemm.py --dtype float32); bf16: onednn"),
    ),
    "decode_attention": _cells(
        (("cuda",), "triton", "split-K paged decode; torch where block_size or head_dim < 16"),
        (("cpu-amx",), "cpp-amx", "K/V read in place from the pool, bf16 Q.K and P.V on AMX "
         "tiles; rows sharing a long cached prefix read it once"),
        (("cpu-avx512bf16",), "cpp-avx512bf16", "K/V read in place, bf16 scores on vdpbf16ps; "
         "rows sharing a long cached prefix read it once"),
        (("cpu-avx512",), "cpp-avx512", "K/V read in place, AVX-512 loops"),
        (("cpu-avx2",), "cpp-avx2", "K/V read in place, AVX2+FMA loops"),
        (("cpu-generic",), "cpp", "K/V read in place, portable loops"),
        (("cpu-no-native",), "torch", "gather the blocks, then SDPA"),
    ),
    "prefill_attention": _cells(
        (("cuda",), "triton", "every chunk of a step in one launch; torch where block_size or "
         "head_dim < 16"),
        (("cpu-amx",), "cpp-amx", "bf16, head_dim % 32 == 0 on AMX tiles: 1.7-4.1x torch's "
         "flash attention (scripts/bench_cpu_attention.py); else torch"),
        (("cpu-avx512bf16",), "cpp-avx512bf16", "bf16, head_dim % 32 == 0 on vdpbf16ps; "
         "else torch"),
        (NO_PAIRS, "torch", "SDPA (torch's CPU flash attention): no bf16 dot product here"),
    ),
    "norm": _cells(
        (("cuda",), "triton", "residual add + RMSNorm in one launch, a row per program "
         "(kernels/triton_fused.py), where the add and F.rms_norm's kernels were several; not "
         "yet timed on a GPU; torch past 8,192 columns"),
        (PAIRS, "cpp-avx512bf16", "residual add + RMSNorm in one pass, bf16 rows on AVX-512 "
         "BF16 (scripts/bench_fused.py)"),
        (LOOPS, "cpp", "residual add + RMSNorm in one pass, compiler-vectorised loops"),
        (("cpu-no-native",), "torch", "F.rms_norm"),
    ),
    "rope": _cells(
        (("cuda",), "triton", "q and k rotated in place in the fused qkv rows in one launch "
         "(kernels/triton_rope.py), and with the KV write where kv_write is triton too; not "
         "yet timed on a GPU"),
        (PAIRS, "cpp-avx512bf16", "q and k rotated in place in the fused qkv rows, bf16 on "
         "AVX-512 BF16 (scripts/bench_fused.py)"),
        (LOOPS, "cpp", "q and k rotated in place in the fused qkv rows, portable loops"),
        (("cpu-no-native",), "torch", "rotate-half in torch"),
    ),
    "activation": _cells(
        (("cuda",), "triton", "SiLU(gate) x up in one launch (kernels/triton_fused.py) "
         "where F.silu and the multiply are two and a temporary; not yet timed on a GPU"),
        (("cpu-amx",), "cpp-amx", "SiLU(gate) x up in the AMX GEMV's and GEMM's epilogue (bf16): "
         "the [rows, 2 x intermediate] projection never written"),
        (("cpu-avx512bf16",), "cpp-avx512bf16", "SiLU(gate) x up in one pass, bf16 on AVX-512"),
        (LOOPS, "cpp", "SiLU(gate) x up in one pass, portable loops"),
        (("cpu-no-native",), "torch", "F.silu(gate) * up"),
    ),
    "kv_write": _cells(
        (("cuda",), "triton", "one program per token; torch where block_size or head_dim < 16"),
        (NATIVE, "cpp", "one copy per token and KV head into its slot"),
        (("cpu-no-native",), "torch", "index_copy_ into the slots"),
    ),
    "sampling": _cells(
        (("cuda",), "triton", "every row of the step in one launch, greedy, temperature, top-k "
         "and top-p (kernels/triton_sampling.py), where torch's path is several; not yet timed "
         "on a GPU"),
        (CPU_CLASSES, "torch", "argmax, one batched inverse-CDF draw, a sort only for top-k/top-p "
         "rows (kernels/sampling.py)"),
    ),
    "lora": _cells(
        (("cuda",), "triton", "segmented shrink/expand (kernels/triton_lora.py): every adapter "
         "of the step in one launch each"),
        (NATIVE, "cpp", "blocks of four rows per adapter, shrink and expand in float, "
         "vdpbf16ps where the build has it (kernels/csrc/lora): 8 adapters ran at 0.87-0.90x "
         "the base's tok/s, the torch path at 0.62x (scripts/bench_lora.py, Zen 4)"),
        (("cpu-no-native",), "torch", "each adapter's rows a batch entry of one shrink and "
         "one expand per sub-module"),
    ),
}
# What each op may be forced to besides its default, where the class runs it.
ALSO: dict[str, tuple[str, ...]] = {
    "gemv": ("gemm",),
    "gemm": ("onednn", "torch"),
    "decode_attention": ("cpp-avx512bf16", "torch", "triton"),
    "prefill_attention": ("cpp-avx512bf16", "torch", "triton"),
    "norm": ("torch", "triton"),
    "rope": ("torch", "triton"),
    "activation": ("cpp-avx512bf16", "torch", "triton"),
    "kv_write": ("torch", "triton"),
    "sampling": ("torch", "triton"),
    "lora": ("cpp", "torch", "triton"),
}
# fmt: on


def runs_on(impl: str, cls: str) -> bool:
    """Whether the class can run the implementation at all (triton on CPU: the interpreter)."""
    if impl == "onednn":
        return cls != "cuda"
    if impl == "cpp-avx512bf16":
        return cls in PAIRS
    return not is_native(impl)


def accepted(op: str, cls: str) -> tuple[str, ...]:
    """The implementations the op may be forced to on the class, its default first."""
    default = TABLE[op][cls].impl
    return (default, *(i for i in ALSO[op] if i != default and runs_on(i, cls)))


def is_native(impl: str) -> bool:
    return impl.startswith("cpp")


def markdown() -> str:
    """The table as docs/architecture.md shows it (a test holds the two equal)."""
    lines = [f"| op | {' | '.join(CLASSES)} | {FORCE_VAR}=op= also |",
             "|---" * (len(CLASSES) + 2) + "|"]  # fmt: skip
    for op in OPS:
        cells = " | ".join(f"`{TABLE[op][cls].impl}`" for cls in CLASSES)
        lines.append(f"| {op} | {cells} | {', '.join(f'`{i}`' for i in ALSO[op]) or '-'} |")
    lines.append("")
    for op in OPS:
        seen: dict[Choice, list[str]] = {}
        for cls in CLASSES:
            seen.setdefault(TABLE[op][cls], []).append(cls)
        for choice, classes in seen.items():
            lines.append(f"- {op}, `{choice.impl}` ({', '.join(classes)}): {choice.reason}")
    return "\n".join(lines) + "\n"
