#!/usr/bin/env python3
"""Tide's engine against vLLM's CPU backend (and transformers) on three workloads, side by side.

    make bench-peers                       # once: vLLM's CPU backend in .venv-peers
    python scripts/bench_peers.py          # every workload, every peer that is installed
    python scripts/bench_peers.py --workloads long --peers tide,vllm

Workloads (prompt token ids from a seed, greedy, ignore_eos, so every engine makes exactly
the asked tokens):
  mixed   the heavy-tailed mix of scripts/bench_engine.py (80% short, 20% long)
  long    64 requests of 2,000-token prompts, 64 output tokens: prefill-bound
  shared  64 requests sharing a 1,024-token system prompt (+16 own tokens), 64 output
          tokens; prefix caching on in both engines
Each engine runs in its own process in turn (vLLM in the peers' virtualenv), model load
excluded. Reported: output tok/s, TTFT p50/p99, and for Tide its share of the run's
roofline (one weight read per step with decode rows at the measured read bandwidth plus the
prefill FLOPs at the measured matmul peak), the split of its step time by
step kind (prefill / mixed / decode) and, from a profiled rerun, by kind of op (matmuls,
attention, other ops, and the rest: Python and scheduling). The last line is one JSON object.
Absolute figures only mean something on a quiet machine: compare the ratios. On a shared
machine whose speed drifts minute to minute, --repeat N alternates the engines N times
each and reports medians and the ratio of each neighbouring pair.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from tide_fleet.infra.bench.peer_workloads import make_workload
from tide_fleet.infra.contract.model_config import ModelConfig
from tide_fleet.worker.models.loader import native_dtype
from tide_fleet.worker.models.resolve import resolve_model_path

ROOT = Path(__file__).resolve().parents[1]
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def run_tide(folder: Path, work_file: Path, args: argparse.Namespace, profile: bool) -> dict:
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_peers_tide.py"), "--model", str(folder),
           "--workload", str(work_file), "--threads", str(args.threads),
           "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--dtype", args.dtype]  # fmt: skip
    return _last_json(cmd + (["--profile"] if profile else []))


def run_vllm(folder: Path, work_file: Path, args: argparse.Namespace) -> dict | None:
    if not PEERS_PYTHON.is_file():
        print("  vllm: not installed (make bench-peers); skipped", file=sys.stderr)
        return None
    cmd = [str(PEERS_PYTHON), str(ROOT / "scripts" / "peer_vllm.py"), "--model", str(folder),
           "--workload", str(work_file), "--threads", str(args.threads),
           "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--dtype", args.dtype]  # fmt: skip
    return _last_json(cmd)


def run_alternating(
    folder: Path, work_file: Path, args: argparse.Namespace, peers: list[str]
) -> dict:
    """Each peer --repeat times, alternating (A B, B A, ...); per peer its median run by
    tok/s, with every run's tok/s; and Tide over vLLM for each pair of neighbouring runs."""
    runs: dict[str, list[dict]] = {"tide": [], "vllm": []}
    for i in range(args.repeat):
        for peer in ("tide", "vllm") if i % 2 == 0 else ("vllm", "tide"):
            if peer not in peers:
                continue
            r = (
                run_tide(folder, work_file, args, False)
                if peer == "tide"
                else run_vllm(folder, work_file, args)
            )
            if r is not None:
                runs[peer].append(r)
    row: dict = {}
    for peer, done in runs.items():
        if done:
            ranked = sorted(done, key=lambda r: r["tok_per_s"])
            row[peer] = {
                **ranked[(len(ranked) - 1) // 2],
                "runs_tok_per_s": [r["tok_per_s"] for r in done],
            }
    if len(runs["tide"]) == len(runs["vllm"]) > 0:
        pairs = zip(runs["tide"], runs["vllm"], strict=True)
        row["pairs"] = [t["tok_per_s"] / v["tok_per_s"] for t, v in pairs]
    return row


def _last_json(cmd: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-2000:]
        raise RuntimeError(f"{Path(cmd[1]).name} failed ({proc.returncode}):\n{tail}")
    result: dict = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="dummy:bench", help="HF folder or dummy:PRESET")
    parser.add_argument("--workloads", default="mixed,long,shared")
    parser.add_argument("--peers", default="tide,vllm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--no-profile", action="store_true", help="skip Tide's op split rerun")
    parser.add_argument(
        "--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
        help="both engines' weights and KV; auto: what Tide's engine picks on this CPU "
        "(bfloat16 with AVX-512 BF16 or AMX, else float32)",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per peer, alternating; medians reported"
    )
    args = parser.parse_args()
    if args.dtype == "auto":
        args.dtype = str(native_dtype(torch.device("cpu"))).removeprefix("torch.")
    folder = resolve_model_path(args.model)
    cfg = ModelConfig.from_folder(folder)
    peers = args.peers.split(",")
    results: dict = {"model": args.model, "threads": args.threads, "dtype": args.dtype}
    print(f"{args.model} in {args.dtype}, {args.threads} threads")
    for name in args.workloads.split(","):
        work = make_workload(name, args.seed, cfg.max_model_len)
        print(f"{name}: {len(work)} requests, {sum(len(p) for p, _ in work)} prompt tokens, "
              f"{sum(o for _, o in work)} output tokens")  # fmt: skip
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(work, f)
        work_file = Path(f.name)
        row = run_alternating(folder, work_file, args, peers)
        if "tide" in peers and not args.no_profile:
            row["tide_ops"] = run_tide(folder, work_file, args, profile=True)["ops"]
        for peer in ("tide", "vllm"):
            r = row.get(peer)
            if r:
                ttft = r.get("ttft_p50_s"), r.get("ttft_p99_s")
                shown = f"TTFT p50 {ttft[0]:.2f} s p99 {ttft[1]:.2f} s" if ttft[0] else "TTFT -"
                print(f"  {peer:5s} {r['tok_per_s']:8.1f} output tok/s ({r['seconds']:.1f} s), "
                      f"{shown}")  # fmt: skip
        if "tide" in row and "vllm" in row:
            row["tide_over_vllm"] = row["tide"]["tok_per_s"] / row["vllm"]["tok_per_s"]
            print(f"  tide / vllm: {row['tide_over_vllm']:.2f}x (medians)")
            if args.repeat > 1:
                print("  tide / vllm per pair: " + ", ".join(f"{r:.2f}x" for r in row["pairs"]))
        if "tide" in row:
            split = row["tide"]["step_split"]
            print("  tide steps: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in split.items()))
        if "tide" in row and "roofline" in row["tide"]:
            roof = row["tide"]["roofline"]
            print(f"  tide at {100 * roof['share']:.0f}% of the run's roofline "
                  f"({roof['seconds']:.1f} s: a weight read per decode step at "
                  f"{roof['read_gb_s']:.1f} GB/s, prefill at {roof['matmul_tflop_s']:.2f} "
                  f"TFLOP/s)")  # fmt: skip
        if "tide_ops" in row:
            print(
                "  tide ops (profiled rerun): "
                + ", ".join(f"{k} {100 * v:.0f}%" for k, v in row["tide_ops"].items())
            )
        results[name] = row
        work_file.unlink()
    print(json.dumps(results, default=float))


if __name__ == "__main__":
    main()
