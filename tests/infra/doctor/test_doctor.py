"""`tide doctor`: each rule on a hand-written recording, the healthy case, and the arithmetic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tide_fleet.infra.doctor.collect import load, save, snapshot
from tide_fleet.infra.doctor.rules import RULES, Thresholds, diagnose
from tide_fleet.infra.doctor.scrape import Scrape, histogram_quantile
from tide_fleet.infra.doctor.snapshot import Snapshot
from tide_fleet.infra.wire.heartbeats import Heartbeat

SNAPSHOTS = Path(__file__).parent / "snapshots"
CASES = sorted(p.name for p in SNAPSHOTS.iterdir() if p.is_dir())


def findings(case: str):
    before, after, interval = load(SNAPSHOTS / case)
    return diagnose(before, after, interval)


def test_every_rule_has_a_recording():
    assert {r.__name__ for r in RULES} | {"healthy"} == set(CASES)


def test_healthy_fleet_has_no_findings():
    assert findings("healthy") == []


@pytest.mark.parametrize("case", [c for c in CASES if c != "healthy"])
def test_each_recording_raises_exactly_its_rule(case):
    found = findings(case)
    assert [f.rule for f in found] == [case], [f.to_dict() for f in found]
    assert found[0].knob and found[0].evidence


def test_admission_evidence():
    (f,) = findings("admission_too_tight")
    assert f.evidence["queued_jobs_before"] == 3 and f.evidence["queued_jobs_after"] == 41
    assert f.evidence["queue_growth_per_s"] == pytest.approx(38 / 5)
    assert f.evidence["kv_cache_usage_max"] == 0.1
    assert f.evidence["running_per_worker"] == {"default-host-1": "2/16"}
    assert "--max-num-seqs" in f.knob


def test_kv_bound_evidence():
    (f,) = findings("kv_bound")
    assert f.subject == "default-host-1"
    assert f.evidence["kv_cache_usage_perc"] == 0.97
    assert f.evidence["preemptions"] == 12 and f.evidence["preemptions_per_s"] == 2.4
    assert "prefix caching" in f.knob and "--kv-cache-memory" in f.knob


def test_bandwidth_bound_evidence():
    (f,) = findings("bandwidth_bound")
    assert (f.evidence["mbu_ema"], f.evidence["mfu_ema"]) == (0.82, 0.04)
    assert f.evidence["tokens_per_step"] == 4.0  # 2000 tokens over 500 steps
    assert "quantised" in f.knob


def test_prefill_starvation_evidence():
    (f,) = findings("prefill_starvation")
    # 20 first tokens in the window, all in the (2.5, 5] bucket: p99 interpolates to 4.975.
    assert f.evidence["requests"] == 20
    assert f.evidence["ttft_p99_s"] == pytest.approx(4.975)
    assert f.evidence["itl_p99_s"] < 0.05
    assert f.evidence["max_num_batched_tokens"] == [1024]
    assert "--max-num-batched-tokens" in f.knob


def test_cold_start_evidence():
    (f,) = findings("cold_starts")
    # 12 jobs ever, 9 of them in (20, 40]: p99 rank 11.88 -> 20 + 20 * 8.88 / 9.
    assert f.evidence["queue_time_p99_s"] == pytest.approx(20 + 20 * 8.88 / 9, abs=1e-3)
    assert f.evidence["youngest_worker_age_s"] == 65.0
    assert f.evidence["running"] == 0 and "min_workers" in f.knob


def test_gateway_cpu_evidence():
    (f,) = findings("gateway_cpu_saturated")
    assert f.evidence == {"cpu_cores_used": 0.95, "requests_per_s": 900.0}


def test_unserved_bucket_evidence():
    (f,) = findings("unserved_bucket")
    assert f.subject == "long" and f.evidence["queued_jobs"] == 3
    assert f.evidence["oldest_job_age_s"] == 17.0
    assert f.evidence["served_buckets"] == ["medium", "short"]


def test_thresholds_are_the_knobs_of_the_rules():
    before, after, interval = load(SNAPSHOTS / "gateway_cpu_saturated")
    assert diagnose(before, after, interval, Thresholds(cpu_saturated=0.99)) == []
    with pytest.raises(ValueError, match="interval_s must be positive"):
        diagnose(before, after, 0)


def test_histogram_quantile_matches_prometheus():
    buckets = {0.1: 10.0, 0.5: 30.0, 1.0: 40.0, math.inf: 40.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * 10 / 20)
    assert histogram_quantile(0.25, buckets) == pytest.approx(0.1)
    assert histogram_quantile(0.99, {0.1: 1.0, math.inf: 10.0}) == 0.1  # in +Inf: last bound
    assert histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None


def test_restarted_worker_counts_from_zero():
    text = "# TYPE tide:num_preemptions_total counter\ntide:num_preemptions_total 5\n"
    kv = "# TYPE tide:kv_cache_usage_perc gauge\ntide:kv_cache_usage_perc 0.99\n"
    before = Snapshot(at=0, workers={"w": Scrape.parse(text.replace(" 5", " 50") + kv)})
    after = Snapshot(at=5, workers={"w": Scrape.parse(text + kv)})
    (f,) = diagnose(before, after, 5)
    assert f.rule == "kv_bound" and f.evidence["preemptions"] == 5  # not -45


def test_save_then_load_round_trips(tmp_path):
    texts = [
        {"gateway": 'tide:backlog_jobs{bucket="short"} 1\n', "worker:w-1": "tide:mbu_ema 0.5\n"},
        {"gateway": 'tide:backlog_jobs{bucket="short"} 2\n', "worker:w-1": "tide:mbu_ema 0.6\n"},
    ]
    beats = {"w-1": Heartbeat(worker_id="w-1", pool="p", buckets=("short",))}
    infos = {w: b.to_hash() for w, b in beats.items()}
    save(tmp_path, texts, {"interval_s": 2.0, "at": [10.0, 12.0], "workers": infos})
    before, after, interval = load(tmp_path)
    assert interval == 2.0 and after.at == 12.0
    assert after.workers["w-1"].total("tide:mbu_ema") == 0.6
    assert before.gateway is not None and before.gateway.by_label("tide:backlog_jobs", "bucket")
    assert after.worker_info == beats
    assert snapshot(texts[1], beats, 12.0).worker_info == beats


def test_a_hand_written_heartbeat_loads_with_defaults():
    _, after, _ = load(SNAPSHOTS / "unserved_bucket")
    beat = after.worker_info["default-host-1"]
    assert (beat.worker_id, beat.pool, beat.buckets) == (
        "default-host-1",
        "default",
        ("short", "medium"),
    )
    assert beat.metrics_url == "http://127.0.0.1:9401/metrics"
    assert beat.held == 0 and beat.idle_since is None and not beat.draining


def test_load_names_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match=r"meta\.json is missing"):
        load(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"interval_s": 0}))
    with pytest.raises(ValueError, match="interval_s must be positive"):
        load(tmp_path)


def test_cli_json_and_exit_status(capsys):
    from tide_fleet.infra.cli.main import main

    assert main(["doctor", "--load", str(SNAPSHOTS / "kv_bound"), "--json"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["workers"] == ["default-host-1"] and body["gateway"] and body["controller"]
    assert [f["rule"] for f in body["findings"]] == ["kv_bound"]
    assert main(["doctor", "--load", str(SNAPSHOTS / "healthy")]) == 0
    assert "no findings" in capsys.readouterr().out
    assert main(["doctor", "--interval", "0"]) == 2
    assert "--interval must be in (0, 600]" in capsys.readouterr().err


def test_cli_text_shows_evidence_and_knob(capsys):
    from tide_fleet.infra.cli.main import main

    main(["doctor", "--load", str(SNAPSHOTS / "gateway_cpu_saturated")])
    out = capsys.readouterr().out
    assert "[gateway_cpu_saturated]" in out and "cpu_cores_used = 0.95" in out
    assert "knob: run more gateway processes" in out


def test_cli_with_nothing_to_read_says_so(capsys):
    from tide_fleet.infra.cli.main import main

    args = ["doctor", "--url", "http://127.0.0.1:9", "--redis-url", "redis://127.0.0.1:9/0",
            "--interval", "0.01", "--timeout", "0.5"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no metrics could be read" in err and "cannot read" in err
