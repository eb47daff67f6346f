"""Which kind of work a profiler op is (matmul, attention or other ops), for the engine
benchmarks' time splits (scripts/bench_peers_tide.py). Standard library only.

tide::gemv_bf16, tide::gemm_bf16 and tide::gate_up_silu_bf16 (gate|up with its SiLU * up in
the epilogue) count as matmuls, tide::decode_shared_prefix as attention. The whole-step
calls (tide::decode_layers, tide::step_layers_packed) record each kernel they call under its
own name, so only their glue (views, copies) is left in their self time: other ops.
"""

from __future__ import annotations

MATMUL = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn",
          "gemv", "gemm", "gate_up_silu")  # fmt: skip
ATTENTION = ("attention", "sdpa", "scaled_dot_product", "write_kv_cache", "flash", "shared_prefix")


def op_kind(name: str) -> str:
    """matmul, attention or other_ops, by the op's (profiler) name."""
    low = name.lower()
    if any(low.startswith(m) or m in low for m in MATMUL):
        return "matmul"
    if any(a in low for a in ATTENTION):
        return "attention"
    return "other_ops"
