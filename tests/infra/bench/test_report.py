"""What a run comes to: request latencies, summaries and goodput, the JSON report, plots."""

from __future__ import annotations

import json

import pytest

from tide_fleet.infra.bench.load import RequestRecord, RunResult
from tide_fleet.infra.bench.plots import tokens_per_second, write_plots
from tide_fleet.infra.bench.report import (
    build_report,
    distribution_ms,
    parse_slos,
    summarize,
    summary_lines,
)


def _record(i: int, ttft: float, tpot: float, n_out: int, ok: bool = True) -> RequestRecord:
    sent = float(i)
    times = [sent + ttft + k * tpot for k in range(n_out)]
    rec = RequestRecord(i, "short" if i % 2 else "long", n_out, sent, ok=ok,
                           prompt_tokens=10, output_tokens=n_out, token_times=times)  # fmt: skip
    rec.finished, rec.queue_s = times[-1], 0.01 * i
    return rec


def test_record_latencies():
    rec = _record(0, ttft=0.2, tpot=0.05, n_out=5)
    assert rec.ttft == pytest.approx(0.2)
    assert rec.tpot == pytest.approx(0.05)
    assert rec.e2e == pytest.approx(0.4)
    assert rec.itls == pytest.approx([0.05] * 4)
    assert _record(0, 0.2, 0.05, 1).tpot is None


def test_summary_throughput_percentiles_and_goodput():
    records = [
        _record(0, ttft=0.1, tpot=0.01, n_out=11),  # good
        _record(1, ttft=0.3, tpot=0.01, n_out=11),  # misses ttft:200
        _record(2, ttft=0.1, tpot=0.05, n_out=11),  # misses tpot:20
        _record(3, ttft=0.1, tpot=0.01, n_out=1),  # good: a one-token answer has no TPOT
        _record(4, ttft=0.1, tpot=0.01, n_out=11, ok=False),  # failed: never good
    ]
    s = summarize(records, duration=4.0, slos={"ttft": 200.0, "tpot": 20.0})
    assert s["requests"] == {"sent": 5, "completed": 4, "failed": 1}
    assert s["throughput"]["requests_per_s"] == 1.0
    assert s["throughput"]["output_tokens_per_s"] == 34 / 4
    assert s["throughput"]["total_tokens_per_s"] == (34 + 40) / 4
    assert s["goodput"] == {"slos_ms": {"ttft": 200.0, "tpot": 20.0}, "requests_per_s": 0.5,
                            "fraction": 0.4}  # fmt: skip
    assert s["ttft_ms"]["count"] == 4
    assert s["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert s["ttft_ms"]["max"] == pytest.approx(300.0)
    assert s["tpot_ms"]["count"] == 3  # the one-token request has none
    assert s["itl_ms"]["count"] == 30
    assert s["queue_ms"]["p50"] == pytest.approx(15.0)


def test_empty_distribution_and_slo_parsing():
    assert distribution_ms([]) == {"count": 0, "mean": None, "p50": None, "p90": None,
                                      "p99": None, "max": None}  # fmt: skip
    assert parse_slos(["ttft:500", "e2e:2000"]) == {"ttft": 500.0, "e2e": 2000.0}
    with pytest.raises(ValueError, match="unknown metric 'itl'"):
        parse_slos(["itl:5"])
    with pytest.raises(ValueError, match="tpot needs a positive number of milliseconds"):
        parse_slos(["tpot:-3"])


def test_report_keys_and_plots(tmp_path):
    records = [_record(i, 0.1 + 0.01 * i, 0.02, 6) for i in range(6)]
    samples = [{"t": t / 2, "total": t % 3, "in_flight": 2, "by_bucket": {"short": t % 3}}
               for t in range(10)]  # fmt: skip
    result = RunResult(records, samples, duration=8.0)
    report = build_report(result, {"ttft": 150.0}, {"seed": 1})
    assert set(report) == {"config", "summary", "by_kind", "queue_depth", "requests"}
    assert set(report["by_kind"]) == {"short", "long"}
    keys = ("requests", "duration_s", "throughput", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
    assert set(report["summary"]) >= {*keys, "queue_ms", "goodput"}
    assert len(report["requests"]) == 6 and report["requests"][0]["token_times"]
    json.dumps(report)  # serialisable as is
    paths = write_plots({"a": result, "b": result}, tmp_path / "plots")
    assert [p.name for p in paths] == ["latency_cdf.png", "timeline.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    assert any("goodput" in line for line in summary_lines(report["summary"]))


def test_batch_jobs_fall_back_to_the_server_ttft_and_count_tokens_at_completion():
    streamed = _record(0, ttft=0.2, tpot=0.5, n_out=4)  # tokens at 0.2, 0.7, 1.2, 1.7
    batch = RequestRecord(1, "short", 7, sent=0.5, ok=True, output_tokens=7, finished=2.4,
                             server_ttft=0.3)  # fmt: skip
    assert batch.ttft == 0.3 and batch.tpot == pytest.approx((1.9 - 0.3) / 6)
    assert tokens_per_second([streamed, batch]) == [2, 2, 7]
    assert tokens_per_second([]) == []
