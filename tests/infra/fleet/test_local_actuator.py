"""The local actuator behind `tide up`: worker processes with ids never reused."""

from __future__ import annotations

from tide_fleet.infra.fleet import local_actuator
from tide_fleet.infra.fleet.local_actuator import LocalActuator
from tide_fleet.infra.fleet.local_fleet import local_default_fleet


class Popen:  # records the argv instead of starting a worker
    pid = 0

    def __init__(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        self.argv = argv

    def poll(self) -> None:
        return None


def test_local_worker_ids_are_never_reused_across_runs(monkeypatch):
    """A stale `tide:drain:default-local-1` from an earlier run (kept in the AOF) drained
    every new worker 3 s after it started: ids now carry the run, so none is reused."""
    monkeypatch.setattr(local_actuator.subprocess, "Popen", Popen)
    fleet = local_default_fleet(0, 2)
    ids = []
    for _ in range(2):  # two runs of `tide up`
        a = LocalActuator(fleet, env={})
        a.launch(fleet.pools["default"], 2)
        ids += list(a.procs["default"])
    assert len(set(ids)) == 4, ids
    assert all(i.startswith("default-local-") for i in ids)


class EnvPopen(Popen):
    def __init__(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(argv)
        self.env = kwargs.get("env") or {}
        self.alive = True

    def poll(self) -> int | None:
        return None if self.alive else 0


def test_each_local_worker_gets_its_own_gpu_and_none_past_the_last(monkeypatch):
    monkeypatch.setattr(local_actuator.subprocess, "Popen", EnvPopen)
    fleet = local_default_fleet(0, 4)
    pool = fleet.pools["default"]
    a = LocalActuator(fleet, env={"CUDA_VISIBLE_DEVICES": "2,5"})
    assert a.gpus == ["2", "5"]
    a.launch(pool, 4)  # two GPUs: two workers, one per GPU
    procs = list(a.procs["default"].values())
    assert sorted(p.proc.env["CUDA_VISIBLE_DEVICES"] for p in procs) == ["2", "5"]
    procs[0].proc.alive = False  # one exits: its GPU is free again
    a.remove_drained(pool)
    a.launch(pool, 1)
    gpus = sorted(p.proc.env["CUDA_VISIBLE_DEVICES"] for p in a.procs["default"].values())
    assert gpus == ["2", "5"]


def test_without_gpus_workers_are_not_pinned(monkeypatch):
    monkeypatch.setattr(local_actuator.subprocess, "Popen", EnvPopen)
    monkeypatch.setattr(local_actuator, "visible_gpus", lambda env: [])
    fleet = local_default_fleet(0, 3)
    a = LocalActuator(fleet, env={})
    a.launch(fleet.pools["default"], 3)
    assert len(a.procs["default"]) == 3
    assert all("CUDA_VISIBLE_DEVICES" not in p.proc.env for p in a.procs["default"].values())


class ExitPopen(Popen):
    def __init__(self, argv, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(argv)
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def terminate(self) -> None:
        pass


def test_a_worker_killed_while_draining_is_reported_and_a_clean_drain_is_not(monkeypatch, caplog):
    """CI's chaos run SIGKILLed a worker the controller had just begun to drain: its death
    went unlogged (only undrained exits were), so it read as a clean drain. A draining
    worker that exits other than cleanly (0) or on the SIGTERM that drained it while it
    was still loading (-15) is reported, with its code."""
    monkeypatch.setattr(local_actuator.subprocess, "Popen", ExitPopen)
    fleet = local_default_fleet(0, 3)
    pool = fleet.pools["default"]
    a = LocalActuator(fleet, env={})
    a.launch(pool, 3)
    procs = list(a.procs["default"].values())
    for p, code in zip(procs, (0, -15, -9), strict=True):
        a.drain(pool, p.worker_id)
        p.proc.code = code
    with caplog.at_level("WARNING", logger="tide.controller"):
        removed = a.remove_drained(pool)
    assert sorted(removed) == sorted(p.worker_id for p in procs)
    warned = [r.getMessage() for r in caplog.records if "exited unexpectedly" in r.getMessage()]
    assert warned == [f"worker {procs[2].worker_id} exited unexpectedly with -9 while draining"]
