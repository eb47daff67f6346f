"""The command line every engine runner of scripts/bench_peers.py takes (Tide's,
scripts/bench_peers_tide.py, and vLLM's, scripts/peer_vllm.py): one contract, one parser.
Standard library only: vLLM's runner imports it from the peers' virtualenv."""

from __future__ import annotations

import argparse


def peer_parser(description: str | None) -> argparse.ArgumentParser:
    """The shared flags; a runner adds its own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    return parser
