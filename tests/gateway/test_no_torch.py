"""The gateway never imports torch (it counts tokens with the `tokenizers` library)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_importing_the_gateway_loads_no_torch():
    code = "import sys, tide_fleet.gateway.app; sys.exit('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env).returncode == 0
