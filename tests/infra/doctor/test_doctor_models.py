"""`tide doctor` on a fleet serving two models: queues, workers and rules are per model."""

from __future__ import annotations

import json

from tide_fleet.infra.doctor.queues import default_model, oldest_age, queue_jobs, served_buckets
from tide_fleet.infra.doctor.rules import diagnose
from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.doctor.snapshot import Snapshot
from tide_fleet.infra.wire.heartbeats import Heartbeat

ALL = ("short", "medium", "long")


def backlog(jobs: dict[tuple[str, str], float], prefix: str = "tide:backlog") -> str:
    """Gateway (or controller) backlog series for (model, bucket) -> queued jobs; model ''
    writes no model label, as a gateway did before a fleet served many models."""
    names = {"tide:backlog": ("jobs", "oldest_job_age_seconds"),
             "tide:controller": ("queue_jobs", "oldest_job_age_seconds")}[prefix]  # fmt: skip
    lines = []
    for name, value in zip(names, (lambda n: n, lambda n: 3.0 * n), strict=True):
        lines.append(f"# TYPE {prefix}_{name} gauge")
        for (model, bucket), n in jobs.items():
            labels = f'model="{model}",bucket="{bucket}"' if model else f'bucket="{bucket}"'
            lines.append(f"{prefix}_{name}{{{labels}}} {value(n)}")
    return "\n".join(lines) + "\n"


def worker(running: float = 1, kv: float = 0.1, seqs: float = 16) -> Scrape:
    return Scrape.parse(
        f"tide:num_requests_running {running}\ntide:kv_cache_usage_perc {kv}\n"
        f"tide:engine_max_num_seqs {seqs}\n"
    )


def beat(worker_id: str, model: str, buckets: tuple[str, ...] = ALL) -> Heartbeat:
    return Heartbeat(worker_id=worker_id, pool=f"pool-{model}", model=model, buckets=buckets)


def snap(
    at: float,
    jobs: dict[tuple[str, str], float],
    beats: list[Heartbeat],
    workers: dict[str, Scrape] | None = None,
    source: str = "gateway",
) -> Snapshot:
    s = Snapshot(at=at, worker_info={b.worker_id: b for b in beats})
    s.workers = workers if workers is not None else {b.worker_id: worker() for b in beats}
    if source == "gateway":
        s.gateway = Scrape.parse(backlog(jobs))
    else:
        s.controller = Scrape.parse(backlog(jobs, "tide:controller"))
    return s


def quiet(model: str) -> dict[tuple[str, str], float]:
    return {(model, b): 0.0 for b in ALL}


def test_queued_jobs_of_a_model_without_workers_name_that_model():
    jobs = quiet("a") | quiet("b") | {("b", "short"): 5.0}
    beats = [beat("a-1", "a"), beat("a-2", "a")]
    (f,) = diagnose(snap(0, jobs, beats), snap(5, jobs, beats), 5)
    assert f.rule == "unserved_bucket" and f.subject == "b:short"
    assert f.title == "model 'b' has 5 jobs queued in bucket 'short' and no live worker serves it"
    assert f.evidence["model"] == "b" and f.evidence["queued_jobs"] == 5
    assert f.evidence["oldest_job_age_s"] == 15.0
    assert f.evidence["workers"] == 0 and f.evidence["served_buckets"] == []
    assert f.evidence["workers_of_other_models"] == 2
    assert "--served-model b" in f.knob


def test_a_worker_of_another_model_does_not_serve_the_bucket():
    jobs = quiet("a") | quiet("b") | {("a", "long"): 2.0, ("b", "long"): 1.0}
    beats = [beat("a-1", "a", ("short", "medium")), beat("b-1", "b", ("long",))]
    found = diagnose(snap(0, jobs, beats), snap(5, jobs, beats), 5)
    assert [(f.rule, f.subject) for f in found] == [("unserved_bucket", "a:long")]
    assert found[0].evidence["served_buckets"] == ["medium", "short"]


def test_the_controllers_reading_is_per_model_too():
    jobs = quiet("a") | quiet("b") | {("b", "medium"): 3.0}
    s = snap(5, jobs, [beat("a-1", "a")], source="controller")
    assert queue_jobs(s)[("b", "medium")] == 3.0 and oldest_age(s)[("b", "medium")] == 9.0
    assert served_buckets(s) == {("a", b) for b in ALL}
    (f,) = diagnose(snap(0, jobs, [beat("a-1", "a")], source="controller"), s, 5)
    assert f.subject == "b:medium"


def test_a_one_model_fleet_reads_as_before():
    # An older worker writes no model in its heartbeat; the gateway names the one model.
    jobs = quiet("llama") | {("llama", "short"): 4.0}
    beats = [beat("w-1", "", ("short", "medium", "long"))]
    after = snap(5, jobs, beats)
    assert default_model(after) == "llama"
    assert served_buckets(after) == {("llama", b) for b in ALL}
    assert diagnose(snap(0, jobs, beats), after, 5) == []
    # Unlabelled series (an older gateway or recording) and model-less heartbeats match too.
    old = quiet("") | {("", "long"): 2.0}
    beats = [beat("w-1", "", ("short",))]
    (f,) = [f for f in diagnose(snap(0, old, beats), snap(5, old, beats), 5)]
    assert f.subject == "long" and "model" not in f.evidence
    assert f.title == "2 jobs queued in bucket 'long' and no live worker serves it"


def test_admission_is_judged_per_model():
    # b's queue grows while b's worker has room; a's workers are full (busy, not too tight).
    before = quiet("a") | quiet("b") | {("a", "short"): 9.0, ("b", "short"): 1.0}
    after = before | {("a", "short"): 30.0, ("b", "short"): 12.0}
    beats = [beat("a-1", "a"), beat("b-1", "b")]
    workers = {"a-1": worker(16, 0.95, 16), "b-1": worker(2, 0.1, 16)}
    found = diagnose(snap(0, before, beats, workers), snap(5, after, beats, workers), 5)
    assert [(f.rule, f.subject) for f in found] == [("admission_too_tight", "workers of 'b'")]
    (f,) = found
    assert f.evidence["model"] == "b"
    assert (f.evidence["queued_jobs_before"], f.evidence["queued_jobs_after"]) == (1, 12)
    assert f.evidence["running_per_worker"] == {"b-1": "2/16"}


def test_cli_names_the_model_and_its_workers(tmp_path, capsys):
    from tide_fleet.infra.cli.main import main
    from tide_fleet.infra.doctor.collect import save

    jobs = quiet("a") | quiet("b") | {("b", "short"): 1.0}
    text = {"gateway": backlog(jobs), "worker:a-1": "tide:num_requests_running 0\n",
            "worker:b-1": "tide:num_requests_running 0\n"}  # fmt: skip
    beats = {"a-1": beat("a-1", "a").to_hash(), "b-1": beat("b-1", "b", ("long",)).to_hash()}
    save(tmp_path, [text, text], {"interval_s": 5.0, "at": [0.0, 5.0], "workers": beats})
    assert main(["doctor", "--load", str(tmp_path), "--json"]) == 1
    body = json.loads(capsys.readouterr().out)
    assert body["models"] == {"a": ["a-1"], "b": ["b-1"]}
    assert [(f["rule"], f["subject"]) for f in body["findings"]] == [("unserved_bucket", "b:short")]
    assert main(["doctor", "--load", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "2 worker(s) (a: 1, b: 1)" in out and "model 'b' has 1 job queued" in out
