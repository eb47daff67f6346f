"""`tide bench` against the real local fleet: a small open-loop run end to end."""

from __future__ import annotations

import json

import pytest

from tests.service.conftest import AUTH
from tide_fleet.infra.cli.main import main


@pytest.mark.parametrize(
    ("api", "priority"),
    [("jobs", "interactive"), ("completions", "interactive"), ("jobs", "batch")],
)
def test_bench_runs_against_a_fleet(fleet, fleet_model, tmp_path, api, priority, capsys):
    out = tmp_path / f"{api}-{priority}"
    argv = ["bench", "--url", fleet.url, "--api-key", AUTH["Authorization"].split()[1],
            "--api", api, "--priority", priority, "--model", str(fleet_model),
            "--num-requests", "10", "--request-rate", "20", "--short-len", "8:6",
            "--long-len", "40:12", "--goodput", "ttft:60000", "tpot:60000",
            "--out-dir", str(out), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert "throughput" in capsys.readouterr().out
    report = json.loads((out / "bench.json").read_text())
    summary = report["summary"]
    assert summary["requests"] == {"sent": 10, "completed": 10, "failed": 0}
    assert summary["goodput"]["fraction"] == 1.0
    assert summary["throughput"]["output_tokens_per_s"] > 0
    for key in ("ttft_ms", "e2e_ms", "queue_ms"):
        assert summary[key]["count"] == 10 and summary[key]["p50"] >= 0
    requests = report["requests"]
    # ignore_eos: every job generates exactly max_tokens, and the gateway counted the prompt.
    assert all(r["output_tokens"] == r["max_tokens"] and r["prompt_tokens"] > 1 for r in requests)
    for r in requests:
        if priority == "batch":  # batch jobs stream no tokens: TTFT from the job record
            assert not r["token_times"] and 0 < r["server_ttft"] < r["finished"] - r["sent"]
            continue
        assert r["sent"] <= r["token_times"][0] <= r["finished"]
        if api == "jobs":  # one delta event per token
            assert len(r["token_times"]) == r["output_tokens"]
    assert {r["kind"] for r in requests} <= {"short", "long"}
    assert report["queue_depth"] and "total" in report["queue_depth"][0]
    assert (out / "latency_cdf.png").stat().st_size > 0 and (out / "timeline.png").is_file()
