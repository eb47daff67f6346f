"""``tide plan``: how a model fits a device, and the engine settings that follow from it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from tide_fleet.infra.cli.option_types import byte_size, dtype_help, dtype_option
from tide_fleet.infra.plan.devices import DEVICES, GiB, get_device
from tide_fleet.infra.plan.model_shape import DTYPE_BYTES, PRESETS
from tide_fleet.infra.plan.planner import (
    DEFAULT_HEADROOM,
    DEFAULT_RESERVE_BYTES,
    MAX_HEADROOM,
    Plan,
)


def _number(
    kind: type[float] | type[int], low: float, high: float | None = None, low_ok: bool = False
) -> Callable[[str], float]:
    """An argparse type that names the limit it enforces (argparse adds the flag's name)."""

    def parse(text: str) -> float:
        try:
            v: float = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        too_low = v < low if low_ok else v <= low
        if too_low or (high is not None and v > high):
            if high is not None:
                raise argparse.ArgumentTypeError(f"must be in [{low}, {high}], got {v}")
            bound = f">= {low}" if low_ok else f"> {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {v}")
        return v

    return parse


def _gib_size(low_ok: bool = False) -> Callable[[str], float]:
    """A size in GiB: a plain number is GiB, or one with a unit (80GB, 512MiB) converts."""

    def parse(text: str) -> float:
        gib = byte_size(text, plain_unit="GiB") / GiB
        if gib < 0 or (gib == 0 and not low_ok):
            raise argparse.ArgumentTypeError(f"must be {'>=' if low_ok else '>'} 0, got {text!r}")
        return gib

    return parse


GIB_HELP = "GiB, or a size with a unit: 80GB (10^9 bytes each), 24GiB (2^30), 512MiB"


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "plan",
        help="memory and batch planner: KV budget, max_num_seqs, roofline, bucket thresholds",
        description="Plan a model on a device: weights, KV bytes per token, KV budget, "
        "concurrent sequences, engine settings, decode roofline and bucket thresholds. "
        "Sizes are GiB (2^30 bytes) unless given with a unit (GB = 10^9 bytes, GiB = 2^30). "
        "See docs/plan.md for every rule.",
    )
    p.add_argument(
        "--model", required=True, help=f"config.json, model folder, or preset: {', '.join(PRESETS)}"
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--device", help=f"device kind: {', '.join(DEVICES)}")
    where.add_argument("--memory-gb", type=_gib_size(), help=f"memory size: {GIB_HELP}")
    dtype = dtype_option(*DTYPE_BYTES)
    p.add_argument("--weight-dtype", type=dtype, default="bfloat16", metavar="DTYPE",
                   help=f"{dtype_help(*DTYPE_BYTES)} (default bfloat16)")  # fmt: skip
    p.add_argument("--kv-dtype", type=dtype, default=None, metavar="DTYPE",
                   help="default: the weight dtype")  # fmt: skip
    p.add_argument("--prompt-len", type=_number(int, 0), default=512, help="average prompt tokens")
    p.add_argument("--output-len", type=_number(int, 0), default=256, help="average output tokens")
    p.add_argument(
        "--p99-len", type=_number(int, 0), default=4096, help="p99 of prompt + output tokens"
    )
    p.add_argument(
        "--reserve-gb",
        type=_gib_size(low_ok=True),
        default=DEFAULT_RESERVE_BYTES / GiB,
        help="CUDA context and activations, in GiB or with a unit (default %(default)s)",
    )
    p.add_argument(
        "--headroom",
        type=_number(float, 0, MAX_HEADROOM, low_ok=True),
        default=DEFAULT_HEADROOM,
        help="fraction of memory kept free (default %(default)s)",
    )
    p.add_argument(
        "--kv-budget-gb",
        type=_gib_size(),
        default=None,
        help="use this KV pool size instead of deriving it (e.g. a worker's "
        "--kv-cache-memory), in GiB or with a unit",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=_number(int, 1, low_ok=True),
        default=1,
        metavar="N",
        help="split the model over N GPUs (N divides the KV heads); memory figures are per "
        "GPU (default 1)",
    )
    p.add_argument(
        "--interconnect-gbs",
        type=_number(float, 0),
        default=None,
        metavar="GB/S",
        help="GPU-to-GPU bandwidth per direction per GPU, in GB/s (10^9 bytes); default: "
        "the device's (NVLink 4: 450, PCIe Gen4 x16: 32)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    from tide_fleet.infra.plan.planner import load_shape, plan

    try:
        shape = load_shape(args.model)
        device = get_device(args.device) if args.device else None
        result = plan(
            shape,
            int(args.memory_gb * GiB) if args.memory_gb is not None else None,
            device=device,
            weight_dtype=args.weight_dtype,
            kv_dtype=args.kv_dtype,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            p99_len=args.p99_len,
            reserve_bytes=int(args.reserve_gb * GiB),
            headroom=args.headroom,
            kv_budget_bytes=int(args.kv_budget_gb * GiB) if args.kv_budget_gb is not None else None,
            tensor_parallel_size=args.tensor_parallel_size,
            interconnect_bytes_per_s=link * 1e9 if (link := args.interconnect_gbs) else None,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print_plan(result)
    return 0


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def _rate(r: float | None) -> str:
    return "n/a (give --device)" if r is None else f"{r:,.0f} tokens/s"


def _tensor_parallel_rows(p: Plan) -> dict[str, list[tuple[str, str, str]]]:
    """Rows only a split model has, keyed by the row they follow: per-GPU shares and the
    all-reduce cost of a step."""
    n = p.tensor_parallel_size
    smallest = p.min_tensor_parallel_size or "none up to 8"
    decode = [
        ("all-reduce per step", f"{p.step_allreduce_bytes / 2**20:,.2f} MiB",
         f"per GPU: 2 x layers x batch {p.recommended_max_num_seqs} x hidden x 2 bytes "
         "x 2(N-1)/N (ring)"),
    ]  # fmt: skip
    if p.step_seconds is not None:
        assert p.step_read_seconds is not None and p.step_allreduce_seconds is not None
        link = f"{p.interconnect} {(p.interconnect_bytes_per_s or 0) / 1e9:,.0f} GB/s"
        decode.append((
            "decode step", f"{p.step_seconds * 1e3:,.2f} ms",
            f"a model: not measured; {p.step_read_seconds * 1e3:,.2f} ms read per GPU + "
            f"{p.step_allreduce_seconds * 1e3:,.2f} ms all-reduce over {link}, no overlap",
        ))  # fmt: skip
    return {
        "parameters": [("tensor parallel", f"{n} GPUs", "memory, KV budget and concurrency "
                        f"are per GPU; smallest that fits: {smallest}")],
        "weights": [("weights per GPU", _gib(p.weight_bytes_per_gpu), "q/k/v/o by heads, "
                     "MLP by intermediate, embedding and lm_head by vocabulary; norms "
                     "replicated")],
        "KV per token": [("KV per token per GPU", f"{p.kv_bytes_per_token_per_gpu / 1024:,.0f}"
                          f" KiB", f"KV per token / {n}: the KV heads split {n} ways")],
        f"decode, batch {p.recommended_max_num_seqs}": decode,
    }  # fmt: skip


def print_plan(p: Plan) -> None:
    from rich.console import Console
    from rich.table import Table

    where = p.device or "memory only"
    if p.is_tensor_parallel:
        where = f"{p.tensor_parallel_size} x {where}"
    t = Table(title=f"tide plan: {p.model} on {where}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column(style="dim")
    rows: list[tuple[str, str, str]] = [
        ("parameters", f"{p.num_parameters / 1e9:.2f} B", ""),
        ("weights", _gib(p.weight_bytes), f"parameters x {p.weight_dtype} bytes"),
        ("KV per token", f"{p.kv_bytes_per_token / 1024:,.0f} KiB", f"2 x layers x kv_heads x "
         f"head_dim x {p.kv_dtype} bytes"),
        ("memory", _gib(p.memory_bytes), f"usable {_gib(p.usable_bytes)} after "
         f"{p.headroom:.0%} headroom"),
        ("reserve", _gib(p.reserve_bytes), f"activations estimated at "
         f"{_gib(p.activation_bytes_estimate)}"),
        ("KV budget", _gib(p.kv_budget_bytes), f"{p.kv_budget_tokens:,} tokens"),
        ("concurrent at avg", str(p.max_concurrent_seqs), f"{p.avg_len:,} tokens each"),
        ("concurrent at p99", str(p.max_concurrent_seqs_p99), f"{p.p99_len:,} tokens each"),
        ("max_num_seqs", str(p.recommended_max_num_seqs), "recommended"),
        ("max_num_batched_tokens", str(p.recommended_max_num_batched_tokens),
         f"max_num_seqs + {p.prefill_chunk_tokens} prefill tokens"),
        ("decode, batch 1", _rate(p.decode_tokens_per_s_batch1),
         f"roofline at {p.decode_context_len:,} tokens of context"),
        (f"decode, batch {p.recommended_max_num_seqs}", _rate(p.decode_tokens_per_s),
         f"{p.decode_bound}-bound" if p.decode_bound else ""),
        ("work rate", _rate(p.work_tokens_per_s), "prompt + output tokens finished"),
        ("bucket short_max", f"{p.bucket_short_max:,}", "TIDE_BUCKET_SHORT_MAX"),
        ("bucket medium_max", f"{p.bucket_medium_max:,}", "TIDE_BUCKET_MEDIUM_MAX"),
    ]  # fmt: skip
    after = _tensor_parallel_rows(p) if p.is_tensor_parallel else {}
    for row in rows:
        t.add_row(*row)
        for extra in after.get(row[0], []):
            t.add_row(*extra)
    console = Console()
    console.print(t)
    console.print(f"worker flags: {p.worker_flags()}", soft_wrap=True, highlight=False)
    for w in p.warnings:
        console.print(f"[yellow]note:[/yellow] {w}", soft_wrap=True, highlight=False)
