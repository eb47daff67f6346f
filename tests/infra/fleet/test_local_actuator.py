"""The local actuator behind `tide up`: worker processes with ids never reused."""

from __future__ import annotations

from infra.fleet import local_actuator
from infra.fleet.fleet_config import local_default_fleet
from infra.fleet.local_actuator import LocalActuator


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
