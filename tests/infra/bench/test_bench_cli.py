"""`tide bench`: its flags and inputs are checked before anything is sent."""

from __future__ import annotations

import pytest

from tide_fleet.infra.cli.main import main


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
    bad = tmp_path / "trace.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    assert main(["bench", "--trace", str(bad), "--max-len", "64", "--model", "nope"]) == 2
    assert "max_tokens is required" in capsys.readouterr().err
