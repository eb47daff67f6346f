"""The local actuator behind `tide up`: worker processes with ids never reused."""

from __future__ import annotations

from tide_fleet.infra.fleet import local_actuator
from tide_fleet.infra.fleet.fleet_config import FleetConfig, parse_fleet
from tide_fleet.infra.fleet.gpus import free_group
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


def gpu_fleet(**pools: int) -> FleetConfig:
    """One pool per keyword, its value the pool's gpus_per_worker, each up to 4 workers."""
    every = ["short", "medium", "long"]
    return parse_fleet({"pools": {name: {"buckets": every, "max_workers": 4, "gpus_per_worker": n}
                                  for name, n in pools.items()}})  # fmt: skip


def pinned(a: LocalActuator, pool: str) -> list[str]:
    return sorted(p.proc.env["CUDA_VISIBLE_DEVICES"] for p in a.procs[pool].values())


def test_a_tensor_parallel_worker_gets_a_group_of_gpus_and_its_flag(monkeypatch):
    monkeypatch.setattr(local_actuator.subprocess, "Popen", EnvPopen)
    fleet = gpu_fleet(tp=2)
    shared = ["--max-num-seqs", "8", "--tensor-parallel-size", "1"]  # tide up's engine flags
    a = LocalActuator(fleet, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4"}, worker_argv=shared)
    a.launch(fleet.pools["tp"], 4)  # five GPUs: two groups of two, the fifth left alone
    assert pinned(a, "tp") == ["0,1", "2,3"]
    for p in a.procs["tp"].values():
        argv = p.proc.argv
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        assert argv.count("--tensor-parallel-size") == 1  # the pool's, not the shared flag
        assert argv[argv.index("--max-num-seqs") + 1] == "8"


def test_groups_are_disjoint_across_pools_and_reused_after_a_worker_exits(monkeypatch):
    monkeypatch.setattr(local_actuator.subprocess, "Popen", EnvPopen)
    fleet = gpu_fleet(one=1, two=2)
    a = LocalActuator(fleet, env={"CUDA_VISIBLE_DEVICES": "a,b,c,d,e,f"})
    a.launch(fleet.pools["one"], 1)  # takes a: the pairs (c,d), (e,f) stay whole
    a.launch(fleet.pools["two"], 4)
    assert pinned(a, "one") == ["a"]
    assert pinned(a, "two") == ["c,d", "e,f"]
    a.launch(fleet.pools["one"], 2)  # b, then nothing is left
    assert pinned(a, "one") == ["a", "b"]
    held = [g for pool in ("one", "two") for s in pinned(a, pool) for g in s.split(",")]
    assert sorted(held) == list("abcdef")  # no GPU twice
    first = next(p for p in a.procs["two"].values() if p.gpus == ("c", "d"))
    first.proc.alive = False  # it exits: its pair is free again
    a.remove_drained(fleet.pools["two"])
    a.launch(fleet.pools["two"], 1)
    assert pinned(a, "two") == ["c,d", "e,f"]


def test_a_group_is_not_started_without_enough_free_gpus(monkeypatch, caplog):
    monkeypatch.setattr(local_actuator.subprocess, "Popen", EnvPopen)
    fleet = gpu_fleet(one=1, four=4)
    a = LocalActuator(fleet, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    a.launch(fleet.pools["one"], 1)
    with caplog.at_level("WARNING", logger="tide.controller"):
        a.launch(fleet.pools["four"], 1)  # three free: not enough for a group of four
    assert a.procs["four"] == {}
    assert "pool four: a worker takes 4 GPU(s) and 3 of the 4 (0,1,2,3) are free" in caplog.text
    a.launch(fleet.pools["one"], 4)
    assert pinned(a, "one") == ["0", "1", "2", "3"]  # single-GPU workers still fit


def test_without_gpus_a_tensor_parallel_worker_runs_unpinned_with_its_flag(monkeypatch):
    monkeypatch.setattr(local_actuator.subprocess, "Popen", EnvPopen)
    monkeypatch.setattr(local_actuator, "visible_gpus", lambda env: [])
    fleet = gpu_fleet(tp=2)
    a = LocalActuator(fleet, env={})
    a.launch(fleet.pools["tp"], 3)
    assert len(a.procs["tp"]) == 3
    for p in a.procs["tp"].values():
        assert "CUDA_VISIBLE_DEVICES" not in p.proc.env
        assert p.proc.argv[p.proc.argv.index("--tensor-parallel-size") + 1] == "2"


def test_free_group_prefers_aligned_blocks() -> None:
    gpus = ["0", "1", "2", "3", "4", "5", "6", "7"]
    assert free_group(gpus, set(), 2) == ["0", "1"]
    assert free_group(gpus, {"1"}, 2) == ["2", "3"]
    assert free_group(gpus, {"1", "3", "5", "7"}, 2) == ["0", "2"]  # no whole pair: any two
    assert free_group(gpus, {"0", "2", "4", "6"}, 4) == ["1", "3", "5", "7"]
    assert free_group(gpus, {"0", "2", "4", "6", "7"}, 4) is None
    assert free_group(gpus, set(), 8) == gpus and free_group(gpus, set(), 9) is None
    assert free_group(["0", "1", "2"], {"0"}, 1) == ["1"]
