"""The engine benchmarks' pieces cannot rot: the workloads' shapes, and Tide's runner on a
tiny model (the vLLM peer needs `make bench-peers` and is not run here)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from tide_fleet.infra.bench.op_kinds import op_kind
from tide_fleet.infra.bench.peer_workloads import make_workload


def test_the_three_workloads_have_the_issue_s_shapes():
    long = make_workload("long", 0, 4096)
    assert len(long) == 64 and {len(p) for p, _ in long} == {2000} and {o for _, o in long} == {64}
    shared = make_workload("shared", 0, 4096)
    assert len(shared) == 64 and {o for _, o in shared} == {64}
    assert len({tuple(p[:1024]) for p, _ in shared}) == 1  # one system prompt
    assert len({tuple(p[1024:]) for p, _ in shared}) > 1
    assert len(make_workload("mixed", 0, 4096)) == 200


def test_tide_runner_reports_tokens_ttft_and_splits(tmp_path, tiny_path):
    work = tmp_path / "work.json"
    work.write_text(json.dumps([[[1, 5, 6, 7], 5], [[1, 8, 9], 3]]))
    script = str(ROOT / "scripts" / "bench_peers_tide.py")
    for extra in ([], ["--profile"]):
        out = subprocess.run(
            [sys.executable, script, "--model", str(tiny_path), "--workload", str(work), *extra],
            capture_output=True, text=True, check=True, timeout=300,
        ).stdout  # fmt: skip
        result = json.loads(out.splitlines()[-1])
        # The remainders (python_and_scheduling, outside_steps) are derived: check what is
        # measured, each share of the wall time and the op kinds the model must have run.
        if extra:
            ops = result["ops"]
            assert ops["matmul"] > 0 and ops["attention"] > 0
            assert ops["matmul"] + ops["attention"] + ops["other_ops"] <= 1.05
        else:
            assert result["tokens"] == 8 and result["ttft_p50_s"] > 0
            split = result["step_split"]
            assert split["prefill"] > 0 and split["decode"] > 0  # both prompts, then decode
            assert split["prefill"] + split["mixed"] + split["decode"] <= 1.0
            # The run's roofline, from peaks measured beside it: a lower bound on its time.
            roof = result["roofline"]
            assert roof["read_gb_s"] > 0.1 and roof["matmul_tflop_s"] > 0.001
            assert roof["seconds"] > 0 and 0 < roof["share"] < 1
            assert roof["share"] == roof["seconds"] / result["seconds"]


def test_every_native_op_lands_in_its_kind():
    """The shared-prefix decode kernel is attention, the GEMM a matmul; the whole-step calls
    record their kernels under the kernels' names (tests/kernels/test_step_packed.py), so
    only their own glue is other_ops."""

    kinds = {
        "mkldnn::_linear_pointwise": "matmul",
        "tide::gemv_bf16": "matmul",
        "tide::gemm_bf16": "matmul",
        "tide::gate_up_silu_bf16": "matmul",
        "tide::decode_layers": "other_ops",
        "tide::step_layers_packed": "other_ops",
        "tide::prefill_attention_varlen": "attention",
        "tide::paged_decode_attention": "attention",
        "tide::prefill_attention": "attention",
        "tide::decode_shared_prefix": "attention",
        "tide::write_kv_cache": "attention",
        "tide::silu_mul": "other_ops",
        "tide::rotary_": "other_ops",
        "tide::add_rms_norm_": "other_ops",
    }
    assert {name: op_kind(name) for name in kinds} == kinds
