"""`tide submit` and `tide status` against a gateway that is not there: one clear line."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import ROOT
from tide_fleet.infra.cli.main import main
from tide_fleet.infra.fleet.redis_server import free_port


@pytest.mark.parametrize("command", [["submit", "hi"], ["status", "job_x"]])
def test_an_unreachable_gateway_is_one_line_naming_the_url(command, capsys):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--url", url])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert url in err and "--url" in err and "Traceback" not in err


def test_the_console_script_says_which_url_it_tried():
    port = free_port()
    res = subprocess.run(
        [str(ROOT / ".venv/bin/tide"), "submit", "hi", "--url", f"http://127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.startswith("error: cannot reach the gateway at ")
    assert f"http://127.0.0.1:{port} (from --url; default http://127.0.0.1:8000)" in res.stderr
    assert "Traceback" not in res.stderr
