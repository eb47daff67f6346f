"""Scenario presets: their arms, the comparison arithmetic, and one tiny live run."""

from __future__ import annotations

import json

import pytest

from tide_fleet.infra.bench import scenarios
from tide_fleet.infra.cli.main import main


def _arm_report(tok_s: float, short_p99: float, p50: float) -> dict:
    ttft = {"count": 3, "p50": p50, "p99": short_p99 * 2}
    return {
        "summary": {
            "throughput": {"output_tokens_per_s": tok_s},
            "ttft_ms": ttft,
            "requests": {"sent": 3, "completed": 3},
        },
        "by_kind": {"short": {"ttft_ms": {**ttft, "p99": short_p99}}, "long": {"ttft_ms": ttft}},
    }


def test_each_scenario_has_two_arms_that_differ_in_one_thing():
    batching = scenarios.build("batching", 512)
    assert [a.workers[0].flags for a in batching.arms] == [
        ("--batching", "continuous"),
        ("--batching", "static"),
    ]
    buckets = scenarios.build("buckets", 512)
    split, fifo = buckets.arms
    assert [w.buckets for w in split.workers] == ["short", "medium,long"]
    assert split.env == {"TIDE_BUCKET_SHORT_MAX": "128", "TIDE_BUCKET_MEDIUM_MAX": "256"}
    assert [w.buckets for w in fifo.workers] == ["short", "short"]
    assert int(fifo.env["TIDE_BUCKET_SHORT_MAX"]) > 512  # every job lands in one bucket
    assert buckets.workload["short_cap"] == 128  # short jobs stay in the short bucket
    prefix = scenarios.build("prefix", 2048)
    assert [a.workers[0].flags for a in prefix.arms] == [(), ("--no-prefix-caching",)]
    assert prefix.workload["shared_prefix_len"] == 1536
    assert scenarios.default_model("prefix") == "dummy:small"
    with pytest.raises(ValueError, match="unknown scenario 'x'"):
        scenarios.build("x", 512)


def test_comparison_ratio_points_at_the_better_arm():
    higher = scenarios.build("batching", 512)
    report = scenarios.compare(
        higher, {"continuous": [_arm_report(300, 0, 1)], "static": [_arm_report(100, 0, 1)]}, {}
    )
    assert report["comparison"]["ratio"] == 3.0
    assert report["comparison"]["continuous"] == 300.0
    lower = scenarios.build("buckets", 512)
    report = scenarios.compare(
        lower, {"buckets": [_arm_report(1, 200, 5)], "fifo": [_arm_report(1, 900, 5)]}, {}
    )
    assert report["comparison"]["ratio"] == 4.5  # fifo's short p99 is 4.5x buckets'
    lines = scenarios.comparison_lines(report)
    assert lines[-1] == "ratio 4.50: buckets is 4.50x better than fifo"
    assert any("short jobs: TTFT p50 5.0 p99 200.0 ms" in line for line in lines)


def test_repeated_rounds_compare_medians():
    higher = scenarios.build("batching", 512)
    rounds = {
        "continuous": [_arm_report(v, 0, 1) for v in (300, 100, 280)],
        "static": [_arm_report(v, 0, 1) for v in (150, 140, 900)],
    }
    report = scenarios.compare(higher, rounds, {})
    c = report["comparison"]
    assert (c["continuous"], c["static"]) == (280, 150)
    assert c["rounds"]["static"] == [150, 140, 900]
    assert c["ratio"] == round(280 / 150, 3)
    lines = scenarios.comparison_lines(report)
    assert sum(line.startswith("continuous #") for line in lines) == 3
    assert "(median of rounds)" in lines[-2]


@pytest.mark.slow
def test_a_tiny_scenario_runs_both_arms(tmp_path, tiny_path, capsys):
    argv = ["bench", "--scenario", "batching", "--model", "dummy:tiny", "--num-requests", "6",
            "--request-rate", "inf", "--short-len", "8:4", "--long-len", "30:8",
            "--repeat", "1", "--out-dir", str(tmp_path), "--no-progress",
            "--keep-logs"]  # fmt: skip
    assert main(argv) == 0
    assert "ratio" in capsys.readouterr().out
    report = json.loads((tmp_path / "scenario.json").read_text())
    assert set(report["arms"]) == {"continuous", "static"}
    for (arm,) in report["arms"].values():
        assert arm["summary"]["requests"]["completed"] == 6
    assert report["comparison"]["ratio"] > 0
    assert (tmp_path / "logs" / "static" / "worker-0.log").is_file()
    assert (tmp_path / "timeline.png").is_file()
