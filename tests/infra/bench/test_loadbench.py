"""The load generator's arithmetic: arrivals, lengths, prompts, traces, statistics, reports."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics

import numpy as np
import pytest

from infra.bench import loadbench as lb
from infra.cli.main import main


def _gaps(rate: float, burstiness: float, n: int = 20_000, seed: int = 3) -> list[float]:
    times = lb.arrival_offsets(n, rate, burstiness, random.Random(seed))
    return [b - a for a, b in itertools.pairwise(times)]


def test_poisson_arrivals_have_the_rate_and_cv_one():
    gaps = _gaps(rate=10.0, burstiness=1.0)
    assert statistics.fmean(gaps) == pytest.approx(0.1, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_arrivals_keep_the_rate_and_have_cv_one_over_sqrt_burstiness(burstiness):
    gaps = _gaps(rate=5.0, burstiness=burstiness)
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.05)
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_arrivals_are_seeded_start_at_zero_and_infinite_rate_sends_at_once():
    a = lb.arrival_offsets(50, 3.0, 1.0, random.Random(1))
    assert a == lb.arrival_offsets(50, 3.0, 1.0, random.Random(1))
    assert a != lb.arrival_offsets(50, 3.0, 1.0, random.Random(2))
    assert a[0] == 0.0 and a == sorted(a)
    assert lb.arrival_offsets(4, math.inf, 1.0, random.Random(0)) == [0.0] * 4
    with pytest.raises(ValueError, match="rate and burstiness must be positive"):
        lb.arrival_offsets(4, 0.0, 1.0, random.Random(0))


def test_length_mix_is_80_20_heavy_tailed_and_capped():
    classes = [
        lb.LengthClass("short", 0.8, 32, 32, 100),
        lb.LengthClass("long", 0.2, 300, 200, 500),
    ]
    rng = random.Random(0)
    draws = [lb.draw_lengths(classes, 0.8, rng) for _ in range(5000)]
    kinds = [k for k, _, _ in draws]
    assert kinds.count("long") / len(kinds) == pytest.approx(0.2, abs=0.02)
    for kind, prompt, output in draws:
        cap = 100 if kind == "short" else 500
        assert prompt >= 2 and output >= 1 and prompt + output <= cap
    short_prompts = [p for k, p, _ in draws if k == "short"]
    assert statistics.median(short_prompts) == pytest.approx(32, rel=0.1)
    assert max(short_prompts) > 2.5 * 32  # the lognormal tail reaches well past the median


def test_prompts_have_the_requested_token_count(tiny_path):
    from worker.models.tokenizer import Tokenizer

    tok = Tokenizer(tiny_path)
    maker = lb.PromptMaker(tok, random.Random(0))
    for n in (2, 7, 64, 300):
        assert len(tok.encode(maker.make(n))) == n
    assert len(tok.encode(maker.make(20, first=False), False)) == 20


def test_prompts_fit_a_subword_tokenizer_closely(stories_path):
    from worker.models.tokenizer import Tokenizer

    tok = Tokenizer(stories_path)
    maker = lb.PromptMaker(tok, random.Random(0))
    for n in (5, 40, 200):
        assert abs(len(tok.encode(maker.make(n))) - n) <= 2


def test_shared_prefix_workload_repeats_the_prefix(tiny_path):
    from worker.models.tokenizer import Tokenizer

    spec = lb.WorkloadSpec(
        num_requests=6, request_rate=2.0, classes=[lb.LengthClass("short", 1, 8, 4, 64)],
        shared_prefix_len=40,
    )  # fmt: skip
    items = lb.build_workload(spec, Tokenizer(tiny_path))
    heads = {it.prompt[:30] for it in items}
    assert len(heads) == 1 and len({it.prompt for it in items}) == 6
    assert items == lb.build_workload(spec, Tokenizer(tiny_path))  # seeded


# -- traces ----------------------------------------------------------------------------


def _trace(tmp_path, lines: list[str]):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trace_rows_and_offsets(tmp_path):
    path = _trace(tmp_path, [
        '{"prompt": "Once upon a time", "max_tokens": 5, "offset": 0.5}',
        "",
        '{"prompt_len": 12, "max_tokens": 3, "offset": 0}',
    ])  # fmt: skip
    rows = lb.load_trace(path)
    assert [(r.prompt, r.prompt_len, r.max_tokens, r.offset) for r in rows] == [
        ("Once upon a time", None, 5, 0.5),
        (None, 12, 3, 0),
    ]
    items = lb.build_workload(lb.WorkloadSpec(num_requests=10, trace=rows), None)
    assert [(i.arrival, i.max_tokens, i.kind) for i in items] == [
        (0, 3, "trace"),
        (0.5, 5, "trace"),
    ]
    assert len(items[0].prompt.split()) == 12  # no tokenizer: one word per token


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "trace.jsonl:1: not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"prompt": "x", "max_tokens": 1, "temp": 0}', "unknown fields ['temp']"),
        (
            '{"prompt": "x", "prompt_len": 3, "max_tokens": 1}',
            "exactly one of prompt or prompt_len",
        ),
        ('{"max_tokens": 1}', "exactly one of prompt or prompt_len"),
        ('{"prompt": "", "max_tokens": 1}', "prompt must be a non-empty string"),
        ('{"prompt_len": 0, "max_tokens": 1}', "prompt_len must be an integer >= 1, got 0"),
        ('{"prompt": "x", "max_tokens": 2.5}', "max_tokens must be an integer >= 1"),
        ('{"prompt": "x"}', "max_tokens is required"),
        (
            '{"prompt": "x", "max_tokens": 1, "offset": -1}',
            "offset must be a number of seconds >= 0",
        ),
    ],
)
def test_trace_errors_name_the_line_and_field(tmp_path, line, message):
    with pytest.raises(lb.TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        lb.load_trace(_trace(tmp_path, [line]))


def test_trace_offsets_all_or_none_and_not_empty(tmp_path):
    mixed = ['{"prompt": "a", "max_tokens": 1, "offset": 1}', '{"prompt": "b", "max_tokens": 1}']
    with pytest.raises(lb.TraceError, match=r"offset on every line or on none \(1 of 2"):
        lb.load_trace(_trace(tmp_path, mixed))
    with pytest.raises(lb.TraceError, match="no requests"):
        lb.load_trace(_trace(tmp_path, [""]))


# -- statistics ------------------------------------------------------------------------


def test_percentiles_match_numpy():
    rng = random.Random(5)
    values = [rng.expovariate(1.0) for _ in range(101)]
    for p in (0, 50, 90, 99, 100):
        assert lb.percentile(values, p) == pytest.approx(float(np.percentile(values, p)))
    assert lb.percentile(list(range(1, 11)), 50) == 5.5
    assert lb.percentile([4.0], 99) == 4.0


def _record(i: int, ttft: float, tpot: float, n_out: int, ok: bool = True) -> lb.RequestRecord:
    sent = float(i)
    times = [sent + ttft + k * tpot for k in range(n_out)]
    rec = lb.RequestRecord(i, "short" if i % 2 else "long", n_out, sent, ok=ok,
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
    s = lb.summarize(records, duration=4.0, slos={"ttft": 200.0, "tpot": 20.0})
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
    assert lb.distribution_ms([]) == {"count": 0, "mean": None, "p50": None, "p90": None,
                                      "p99": None, "max": None}  # fmt: skip
    assert lb.parse_slos(["ttft:500", "e2e:2000"]) == {"ttft": 500.0, "e2e": 2000.0}
    with pytest.raises(ValueError, match="unknown metric 'itl'"):
        lb.parse_slos(["itl:5"])
    with pytest.raises(ValueError, match="tpot needs a positive number of milliseconds"):
        lb.parse_slos(["tpot:-3"])


def test_report_keys_and_plots(tmp_path):
    records = [_record(i, 0.1 + 0.01 * i, 0.02, 6) for i in range(6)]
    samples = [{"t": t / 2, "total": t % 3, "in_flight": 2, "by_bucket": {"short": t % 3}}
               for t in range(10)]  # fmt: skip
    result = lb.RunResult(records, samples, duration=8.0)
    report = lb.build_report(result, {"ttft": 150.0}, {"seed": 1})
    assert set(report) == {"config", "summary", "by_kind", "queue_depth", "requests"}
    assert set(report["by_kind"]) == {"short", "long"}
    keys = ("requests", "duration_s", "throughput", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
    assert set(report["summary"]) >= {*keys, "queue_ms", "goodput"}
    assert len(report["requests"]) == 6 and report["requests"][0]["token_times"]
    json.dumps(report)  # serialisable as is
    paths = lb.write_plots({"a": result, "b": result}, tmp_path / "plots")
    assert [p.name for p in paths] == ["latency_cdf.png", "timeline.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    assert any("goodput" in line for line in lb.summary_lines(report["summary"]))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--burstiness", "0"], "--burstiness must be > 0"),
        (["--request-rate", "-2"], "--request-rate must be > 0 (or inf)"),
        (["--num-requests", "0"], "--num-requests must be > 0"),
        (["--long-fraction", "1.5"], "--long-fraction must be in [0, 1]"),
        (["--short-len", "10"], "--short-len must be PROMPT:OUTPUT"),
    ],
)
def test_cli_flags_are_checked(argv, message, capsys):
    with pytest.raises(SystemExit):
        main(["bench", *argv])
    assert message in capsys.readouterr().err


def test_cli_reports_bad_goodput_and_trace(tmp_path, capsys):
    assert main(["bench", "--goodput", "ttft:0"]) == 2
    assert "ttft needs a positive number" in capsys.readouterr().err
    bad = _trace(tmp_path, ['{"prompt": "x"}'])
    assert main(["bench", "--trace", str(bad), "--max-len", "64", "--model", "nope"]) == 2
    assert "max_tokens is required" in capsys.readouterr().err


def test_batch_jobs_fall_back_to_the_server_ttft_and_count_tokens_at_completion():
    streamed = _record(0, ttft=0.2, tpot=0.5, n_out=4)  # tokens at 0.2, 0.7, 1.2, 1.7
    batch = lb.RequestRecord(1, "short", 7, sent=0.5, ok=True, output_tokens=7, finished=2.4,
                             server_ttft=0.3)  # fmt: skip
    assert batch.ttft == 0.3 and batch.tpot == pytest.approx((1.9 - 0.3) / 6)
    assert lb.tokens_per_second([streamed, batch]) == [2, 2, 7]
    assert lb.tokens_per_second([]) == []
