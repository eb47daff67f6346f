"""Which implementation serves each op on each hardware class: the one table, and the switch.

``TABLE`` maps (op, hardware class) to an implementation and why. The code that runs an op
asks ``impl(op, device)``; an implementation whose own conditions a call does not meet
(dtype, shape) hands it on down a fixed chain: a native GEMM or oneDNN's matmul to ``torch``
(``F.linear``), the native GEMV to the op's ``gemm`` implementation, native attention and
elementwise kernels (native or Triton) to ``torch``. Those conditions stay beside the kernels
(``linear.py``, ``attention.py``, ``elementwise.py``); which implementation is asked first is
only decided here.

Hardware classes: ``cuda``; on CPU what the native build runs on (``cpu.isa()``):
``cpu-amx``, ``cpu-avx512bf16``, ``cpu-avx512`` (no bf16 dot product), ``cpu-avx2``,
``cpu-generic`` (portable C++ loops), ``cpu-no-native`` (no compiler, ``TIDE_CPU_KERNELS=0``,
or an install without Tide's settings). Other devices (``meta`` in tests) take the torch
reference throughout.

Forcing: ``TIDE_KERNELS="gemm=torch,decode_attention=torch"`` (checked against ``accepted``:
a ValueError names the variable, the op and what this machine accepts). The engine's
``--attention-backend`` forces the three attention ops the same way, through ``force``.
``python -m tide_fleet.kernels`` prints the table as it resolves here.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from tide_fleet.kernels import cpu as cpu_kernels

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


@dataclass(frozen=True)
class Resolved:
    op: str
    cls: str
    impl: str
    source: str  # default | forced
    reason: str


_forced: dict[str, tuple[str, str]] = {}  # op -> (impl, who forced it): force()


def force(op: str, impl: str | None, origin: str) -> None:
    """Force op to impl in this process, over TIDE_KERNELS (``--attention-backend`` does);
    None lifts a force that ``origin`` set."""
    if impl is not None:
        _check(op, impl, origin)
        _forced[op] = (impl, origin)
    elif op in _forced and _forced[op][1] == origin:
        del _forced[op]
    refresh()


def refresh() -> None:
    """Read TIDE_KERNELS and the forces again (after a test changes them)."""
    _resolved.cache_clear()
    env_forces.cache_clear()


@functools.cache
def env_forces() -> dict[str, str]:
    """TIDE_KERNELS parsed: {op: impl}; a ValueError for an unknown op, or an impl this
    machine's classes cannot run. Read here, not through infra.settings: the kernels also
    serve an engine-only install, which has no settings (as TIDE_CHECK_DEVICES, launch.py)."""
    forces = {}
    for item in filter(None, (part.strip() for part in os.environ.get(FORCE_VAR, "").split(","))):
        op, eq, impl = (s.strip() for s in item.partition("="))
        if not eq:
            raise ValueError(f"{FORCE_VAR}: {item!r} is not op=impl (e.g. gemm=torch)")
        _check(op, impl, FORCE_VAR)
        forces[op] = impl
    return forces


def _check(op: str, impl: str, origin: str) -> None:
    if op not in TABLE:
        raise ValueError(f"{origin}: unknown op {op!r}; the ops are {', '.join(OPS)}")
    if torch.cuda.is_available() and impl in accepted(op, "cuda"):
        return  # without asking the CPU (a GPU worker builds no native CPU kernels)
    local = machine_classes()
    ok = sorted({i for cls in local for i in accepted(op, cls)})
    if impl not in ok:
        raise ValueError(
            f"{origin}: {op}={impl!r} does not run on this machine ({', '.join(local)}); "
            f"{op} accepts {', '.join(ok)}"
        )


def machine_classes() -> tuple[str, ...]:
    """This machine's hardware classes: its CPU's, and cuda where torch sees a GPU."""
    return (cpu_class(), "cuda") if torch.cuda.is_available() else (cpu_class(),)


@functools.cache
def cpu_class() -> str:
    isa = cpu_kernels.isa()
    return f"cpu-{isa}" if isa else "cpu-no-native"


def hardware_class(device: torch.device | str) -> str | None:
    """The class of a device: cuda, this CPU's, or None (another device: torch throughout)."""
    kind = device if isinstance(device, str) else device.type
    return "cuda" if kind == "cuda" else cpu_class() if kind == "cpu" else None


@functools.cache
def _resolved(kind: str) -> dict[str, Resolved]:
    cls = hardware_class(kind)
    if cls is None:
        return {op: Resolved(op, kind, "gemm" if op == "gemv" else "torch", "default",
                             "not a Tide device: the torch reference") for op in OPS}  # fmt: skip
    env = env_forces()
    table = {}
    for op in OPS:
        choice = TABLE[op][cls]
        impl, origin = _forced.get(op) or (env.get(op), FORCE_VAR)
        if impl is None or impl == choice.impl:
            table[op] = Resolved(op, cls, choice.impl, "default" if impl is None else "forced",
                                 choice.reason)  # fmt: skip
            continue
        if impl not in accepted(op, cls):
            raise ValueError(f"{origin}: {op}={impl!r} does not run on {cls}; {op} accepts "
                             f"{', '.join(accepted(op, cls))}")  # fmt: skip
        table[op] = Resolved(op, cls, impl, "forced", f"forced by {origin}")
    if cls == "cpu-amx":  # the AVX-512 BF16 attention paths where tiles would run
        ops = cpu_kernels.ops()
        ops.decode_attention_prefer_vector(table["decode_attention"].impl == "cpp-avx512bf16")
        ops.attention_pass_prefer_vector(table["prefill_attention"].impl == "cpp-avx512bf16")
    return table


def impl(op: str, device: torch.device | str) -> str:
    """The implementation that serves op on device (a forced one where forced)."""
    return _resolved(device if isinstance(device, str) else device.type)[op].impl


def is_default(ops: tuple[str, ...], device: torch.device) -> bool:
    """Every op takes its class's default here: what the whole-step native calls embed."""
    table = _resolved(device.type)
    if hardware_class(device) is None:
        return False
    return all(table[op].impl == TABLE[op][table[op].cls].impl for op in ops)


def describe(device: torch.device | str | None = None) -> dict[str, Resolved]:
    """The table as it resolves for device (default: cuda where there is one, else cpu)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return dict(_resolved(device if isinstance(device, str) else device.type))


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


def main() -> int:
    """Print the table as it resolves here (``python -m tide_fleet.kernels``)."""
    for kind in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        for row in describe(kind).values():
            print(f"{row.cls:15} {row.op:18} {row.impl:15} {row.source:8} {row.reason}")
    return 0
