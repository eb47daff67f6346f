"""A scenario arm's fleet starts its children the one way Tide starts child processes."""

from __future__ import annotations

import os
import sys

from tide_fleet.infra.bench.scenario_fleet import ROOT, ScenarioFleet
from tide_fleet.infra.bench.scenarios import build
from tide_fleet.infra.fleet.supervisor import orphan_safe


def test_fleet_children_start_as_the_local_fleet_starts_them(tmp_path):
    # One way to start a child: orphan-safe (dies with tide bench), output to its log.
    fleet = ScenarioFleet(build("prefix", 512).arms[0], "m", tmp_path, 4, None)
    argv = [sys.executable, "-c", "import os; print(os.getcwd())"]
    fleet._spawn("child", argv, dict(os.environ))
    (proc,) = fleet.procs
    assert proc.wait(timeout=30) == 0
    assert proc.args == orphan_safe(argv)
    assert (tmp_path / "child.log").read_text().strip() == str(ROOT)
