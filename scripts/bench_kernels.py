#!/usr/bin/env python3
"""GPU kernel benchmark: Triton paged decode attention against its bandwidth roofline.

Decode attention at batch 64, context 4,096, head_dim 128, 32 query heads over 8 KV
heads, bf16, block size 16, scattered blocks. Prints achieved bandwidth (bytes of K and V
read per second) against the device's peak, and the time against torch SDPA on the
same KV already gathered dense (so SDPA's time excludes the gather it would need).
Target: >= 70% of peak HBM bandwidth on H100/H200. One JSON line; under a minute.

    python scripts/bench_kernels.py            # needs CUDA
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from gpu_decode import device_time


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    """Seconds per call over 50 back-to-back calls (CUDA events), after warm-up calls."""
    for _ in range(4):
        fn()
    return device_time(fn, torch.device("cuda"), 50)


# Peak HBM bandwidth, bytes/s (vendor figures).
PEAK_BANDWIDTH = {
    "H200": 4.8e12, "H100 SXM": 3.35e12, "H100 PCIe": 2.0e12, "H100": 3.35e12,
    "A100-SXM4-80GB": 2.04e12, "A100 80GB PCIe": 1.94e12, "A100": 1.56e12,
    "L40S": 0.864e12, "L4": 0.3e12, "A10G": 0.6e12, "T4": 0.32e12,
    "RTX 4090": 1.008e12, "RTX 3090": 0.936e12,
}  # fmt: skip


def peak_for(name: str) -> float | None:
    for key in sorted(PEAK_BANDWIDTH, key=len, reverse=True):
        if key.lower() in name.lower():
            return PEAK_BANDWIDTH[key]
    return None


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_kernels.py needs a CUDA device")
    from tide_fleet.kernels.triton_decode import decode_attention

    batch, context, heads, kv_heads, head_dim, block = 64, 4096, 32, 8, 128, 16
    dev, dtype = torch.device("cuda"), torch.bfloat16
    blocks_per_seq = context // block
    num_blocks = batch * blocks_per_seq + 16
    k_cache = torch.randn(kv_heads, num_blocks, block, head_dim, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(num_blocks, device=dev)[: batch * blocks_per_seq].view(batch, -1)
    lens = torch.full((batch,), context, dtype=torch.int32, device=dev)
    q = torch.randn(batch, heads, head_dim, device=dev, dtype=dtype)
    scale = head_dim**-0.5
    t_triton = timed(lambda: decode_attention(q, k_cache, v_cache, tables, lens, scale, context))
    kv_bytes = 2 * batch * context * kv_heads * head_dim * k_cache.element_size()
    k_dense = k_cache[:, tables].reshape(kv_heads, batch, context, head_dim).transpose(0, 1)
    v_dense = v_cache[:, tables].reshape(kv_heads, batch, context, head_dim).transpose(0, 1)
    k_dense, v_dense = k_dense.contiguous(), v_dense.contiguous()
    t_sdpa = timed(lambda: F.scaled_dot_product_attention(
        q.unsqueeze(2), k_dense, v_dense, scale=scale, enable_gqa=True))  # fmt: skip
    name = torch.cuda.get_device_name(dev)
    peak = peak_for(name)
    achieved = kv_bytes / t_triton
    print(json.dumps({
        "device": name, "triton_ms": t_triton * 1e3, "sdpa_dense_ms": t_sdpa * 1e3,
        "kv_bytes": kv_bytes, "achieved_gb_per_s": achieved / 1e9,
        "peak_gb_per_s": peak / 1e9 if peak else None,
        "fraction_of_peak": achieved / peak if peak else None,
        "triton_over_sdpa_time": t_triton / t_sdpa,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
