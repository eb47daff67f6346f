#!/usr/bin/env python3
"""Batch benchmark: a 2,000-line batch through the local fleet against the offline runner.

Starts `tide up --workers 1` (embedded Redis, gateway, one worker, Celery, reaper), runs
the batch through the Files and Batches API (`tide batch run`), then runs the same file
with `tide batch run --offline` on the same engine settings in this process, and prints
output tokens/s for both and the fleet's overhead as a ratio. Last line: one JSON object.

    python scripts/bench_batch.py [--lines 2000] [--model ../shared/models/stories260K]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tide_fleet.infra.cli.batch import run_fleet
from tide_fleet.infra.cli.batch_offline import run_offline
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]

STORIES = ROOT.parent / "shared/models/stories260K"
PROMPTS = ["Once upon a time", "Lily wanted to", "The little dog", "One day, a big bear", "Tom had"]


def make_input(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as f:
        for i in range(n):
            long = rng.random() < 0.2
            body = {
                "prompt": rng.choice(PROMPTS) + (" and then" * rng.randint(20, 60) if long else ""),
                "max_tokens": rng.randint(100, 200) if long else rng.randint(8, 64),
                "temperature": 0,
                "ignore_eos": True,
            }
            f.write(
                json.dumps(
                    {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}
                )
                + "\n"
            )


def tokens(path: Path) -> int:
    total = 0
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["response"] and row["response"]["body"]:
            total += row["response"]["body"]["usage"]["completion_tokens"]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--model", default=str(STORIES) if STORIES.is_dir() else "dummy:tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--worker-threads", type=int, default=None,
        help="torch threads in the fleet's worker (OMP_NUM_THREADS); default: torch's choice",
    )  # fmt: skip
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tide-bench-batch-"))
    src = tmp / "input.jsonl"
    make_input(src, args.lines, args.seed)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIDE_DATA_DIR": str(tmp / "data")}
    env.pop("REDIS_URL", None)
    if args.worker_threads:
        env["OMP_NUM_THREADS"] = str(args.worker_threads)
    argv = [
        sys.executable,
        "-m",
        "tide_fleet.infra.cli",
        "up",
        "--workers",
        "1",
        "--port",
        str(port),
    ]
    up = subprocess.Popen(
        [*argv, "--model", args.model],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_ready(url, timeout=180)
        time.sleep(3)  # the worker loads its engine after the gateway is ready
        t0 = time.perf_counter()
        run_fleet(src, tmp / "fleet.jsonl", url, None)
        fleet_s = time.perf_counter() - t0
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=120)
    t0 = time.perf_counter()
    run_offline(src, tmp / "offline.jsonl", args.model, None)
    offline_s = time.perf_counter() - t0
    fleet_tok, offline_tok = tokens(tmp / "fleet.jsonl"), tokens(tmp / "offline.jsonl")
    result = {
        "lines": args.lines,
        "model": args.model,
        "fleet": {"seconds": fleet_s, "tokens": fleet_tok, "tok_per_s": fleet_tok / fleet_s},
        "offline": {
            "seconds": offline_s,
            "tokens": offline_tok,
            "tok_per_s": offline_tok / offline_s,
        },
    }
    result["fleet_over_offline"] = result["fleet"]["tok_per_s"] / result["offline"]["tok_per_s"]
    print(
        f"{args.lines} lines: fleet {result['fleet']['tok_per_s']:.0f} tok/s ({fleet_s:.1f} s), "
        f"offline {result['offline']['tok_per_s']:.0f} tok/s ({offline_s:.1f} s): "
        f"fleet/offline = {result['fleet_over_offline']:.2f}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
