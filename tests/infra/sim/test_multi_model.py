"""Two models, one fleet, simulated: jobs go only to their model's pools, each pool's policy
reads its own model's backlog (as the controller does), so a model whose traffic stops
scales to zero while the other keeps serving; the results split waits and GPU-hours by
model and the totals stay what they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tide_fleet.infra.cli.main import main
from tide_fleet.infra.fleet.fleet_config import FleetConfig, parse_fleet
from tide_fleet.infra.sim.models import FleetModels
from tide_fleet.infra.sim.policies import StaticPolicy, TidePolicy
from tide_fleet.infra.sim.service_model import ServiceModel, service_models
from tide_fleet.infra.sim.simulation import SimConfig, Simulation
from tide_fleet.infra.sim.traces import Job, load_trace, make_jobs

POOL = {"buckets": ["short", "medium", "long"], "device": "l4", "target_wait_s": 15,
        "cold_start_s": 10, "idle_s": 30, "tokens_per_s": 100, "max_workers": 2}  # fmt: skip


def two_models(**pool: object) -> FleetConfig:
    return parse_fleet({
        "controller": {"poll_interval_s": 5, "scale_in_cooldown_s": 10},
        "pools": {"pa": POOL | {"served_name": "a"} | pool,
                  "pb": POOL | {"served_name": "b"} | pool},
    })  # fmt: skip


def fixed(seqs: int = 4, step: float = 0.1) -> ServiceModel:
    return ServiceModel(max_num_seqs=seqs, kv_tokens=10**6, step_s=step)


def trace(tmp_path: Path, rows: list[tuple[float, int, str]]) -> Path:
    """(arrival, output tokens, model) -> a trace file; 10 prompt tokens, max_tokens = output."""
    path = tmp_path / "two.jsonl"
    path.write_text("".join(
        json.dumps({"arrival_s": t, "prompt_tokens": 10, "max_tokens": out, "model": m}) + "\n"
        for t, out, m in rows
    ))  # fmt: skip
    return path


def test_model_b_scales_to_zero_while_a_keeps_serving(tmp_path: Path) -> None:
    # A sends a job every 4 s for 600 s, B only for the first 100 s. Each pool sizes for
    # its own model's queue: B's worker goes idle after ~100 s and is removed idle_s (30 s)
    # later, A's serves to the end.
    fleet = two_models()
    rows = [(float(t), 20, "a") for t in range(0, 601, 4)]
    rows += [(float(t) + 1, 20, "b") for t in range(0, 101, 4)]
    models = FleetModels(fleet)
    jobs, span = load_trace(trace(tmp_path, rows), models=models)
    sim = Simulation(fleet, jobs, {"pa": fixed(), "pb": fixed()}, span)
    r = sim.run(TidePolicy(fleet, SimConfig()))
    b_workers = [w for w in sim.all_workers if w.pool == "pb"]
    a_workers = [w for w in sim.all_workers if w.pool == "pa"]
    assert b_workers and all(100 < w.removed < 100 + 30 + 20 for w in b_workers)
    assert any(w.launched <= 590 < w.removed for w in a_workers)  # A still serving
    assert sum(w.served for w in b_workers) == sum(j.work for j in jobs if j.model == "b")
    assert sum(w.served for w in a_workers) == sum(j.work for j in jobs if j.model == "a")
    assert set(r.by_model) == {"a", "b"}
    a, b = r.by_model["a"], r.by_model["b"]
    assert (a.jobs, b.jobs) == (151, 26)
    assert b.gpu_hours < a.gpu_hours / 3
    assert a.gpu_hours + b.gpu_hours == pytest.approx(r.gpu_hours)
    assert r.slo_met  # each pool's p99 within its target, after one cold start


def test_jobs_wait_for_their_own_models_pool_by_hand(tmp_path: Path) -> None:
    # One slot per worker, 1 s a token. B's first job holds pb from 0 to 100; B's second (t=1)
    # waits for it (99 s) although pa is idle, A's job (t=2) starts at once on pa.
    fleet = two_models()
    path = trace(tmp_path, [(0, 100, "b"), (1, 10, "b"), (2, 10, "a")])
    jobs, _ = load_trace(path, models=FleetModels(fleet))
    models = {"pa": fixed(1, 1.0), "pb": fixed(1, 1.0)}
    r = Simulation(fleet, jobs, models, 0.0).run(StaticPolicy(fleet, {"pa": 1, "pb": 1}))
    assert [w for _, w in r.waits] == [0, 99, 0]
    assert r.by_model["b"].jobs == 2 and r.by_model["b"].p99_wait_s == pytest.approx(98.01)
    assert r.by_model["b"].p50_wait_s == pytest.approx(49.5)
    assert r.by_model["a"].p99_wait_s == 0
    # Both workers are billed from 0 to the end (110 s).
    assert r.by_model["a"].gpu_hours == pytest.approx(110 / 3600)
    assert r.by_model["b"].gpu_hours == pytest.approx(110 / 3600)
    summary = r.summary()["models"]
    assert summary["b"] == {"jobs": 2, "p50_wait_s": 49.5, "p99_wait_s": 98.01,
                            "gpu_hours": round(110 / 3600, 3)}  # fmt: skip


def test_jobs_that_name_no_model_are_the_default_models() -> None:
    # Jobs made without the fleet's models (as before models had names) go to the default
    # model's pools: the first pool's model, or default_model.
    for default, pool in ((None, "pa"), ("b", "pb")):
        spec = {"pools": {"pa": POOL | {"served_name": "a"}, "pb": POOL | {"served_name": "b"}}}
        fleet = parse_fleet(spec | ({"default_model": default} if default else {}))
        sim = Simulation(fleet, make_jobs([(0.0, 10, 10, 10)]), {"pa": fixed(), "pb": fixed()}, 0)
        sim.run(StaticPolicy(fleet, {"pa": 1, "pb": 1}))
        assert [w.pool for w in sim.all_workers if w.served] == [pool]


def test_a_job_of_a_model_no_pool_serves_is_refused() -> None:
    fleet = two_models()
    job = Job(0, 0.0, 10, 10, 10, "short", "c")
    with pytest.raises(ValueError, match=r"job 1 \(arrival 0s\): model 'c' is served by no pool"):
        Simulation(fleet, [job], {"pa": fixed(), "pb": fixed()}, 0.0)


def test_pools_of_different_models_get_their_own_service_model() -> None:
    fleet = parse_fleet({"pools": {
        "pa": {"buckets": ["short", "medium", "long"], "device": "a100-80gb",
               "served_name": "a", "model": "llama-3-8b"},
        "pb": {"buckets": ["short", "medium", "long"], "device": "a100-80gb",
               "served_name": "b", "model": "llama-2-13b"},
    }})  # fmt: skip
    models = service_models(fleet)
    assert "llama-3-8b" in models["pa"].source and "llama-2-13b" in models["pb"].source
    assert models["pb"].step_s > models["pa"].step_s  # 13B weights take longer to read
    assert FleetModels(fleet).names() == ["a", "b"]


def test_one_model_fleet_reports_its_model_as_default() -> None:
    fleet = parse_fleet({"pools": {"p": {"buckets": ["short", "medium", "long"]}}})
    assert FleetModels(fleet).names() == ["default"]


def test_cli_two_models_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text(
        "[controller]\npoll_interval_s = 5\n"
        + "".join(
            f'[pools.p{m}]\nserved_name = "{m}"\nbuckets = ["short", "medium", "long"]\n'
            'device = "a100-80gb"\ntokens_per_s = 4350\nmax_workers = 2\n'
            for m in "ab"
        )
    )
    rows = [(float(t), 50, "a") for t in range(0, 1200, 3)]
    rows += [(float(t) + 1, 50, "b") for t in range(0, 300, 3)]
    path = trace(tmp_path, rows)
    argv = ["simulate", "--trace", str(path), "--fleet", str(toml), "--json",
            "--policies", "tide,static_peak"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)["policies"]
    for figures in out.values():
        assert set(figures["models"]) == {"a", "b"}
        assert figures["models"]["a"]["jobs"] == 400 and figures["models"]["b"]["jobs"] == 100
    tide = out["tide"]["models"]
    assert tide["b"]["gpu_hours"] < tide["a"]["gpu_hours"]
    # The table names each model too.
    assert main([*argv[:-3], "--policies", "tide"]) == 0
    table = capsys.readouterr().out
    assert "by model" in table and "a 400 jobs" in table and "b 100 jobs" in table
    # A built-in trace over a mix of the fleet's models.
    mix = ["simulate", "--trace", "mixed", "--hours", "0.5", "--fleet", str(toml), "--json",
           "--policies", "tide", "--models", "a:0.7,b:0.3"]  # fmt: skip
    assert main(mix) == 0
    jobs = {m: f["jobs"] for m, f in json.loads(capsys.readouterr().out)["policies"]["tide"]
            ["models"].items()}  # fmt: skip
    assert 0.6 < jobs["a"] / (jobs["a"] + jobs["b"]) < 0.8
    # Errors: a model the fleet does not serve (file and mix), a bad mix.
    bad = trace(tmp_path, [(0.0, 5, "a"), (1.0, 5, "zeta")])
    assert main(["simulate", "--trace", str(bad), "--fleet", str(toml)]) == 2
    assert "two.jsonl:2: model 'zeta' is not served" in capsys.readouterr().err
    assert main([*mix[:-1], "a:0.7,zeta:0.3"]) == 2
    assert "--models: model 'zeta' is not served" in capsys.readouterr().err
    assert main([*mix[:-1], "a=0.7"]) == 2
    assert "--models: 'a=0.7'" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(path), "--models", "a:1", "--fleet", str(toml)]) == 2
    assert "--models applies to the built-in traces" in capsys.readouterr().err


def test_help_describes_the_model_column(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert '"model"?' in text and "--models" in text and "per model" in text
