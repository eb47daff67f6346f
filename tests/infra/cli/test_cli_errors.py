"""`tide` answers a bad invocation in one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tide_fleet.infra.fleet.redis_server import free_port

LINE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                   "body": {"prompt": "hi", "max_tokens": 2}})  # fmt: skip


def tide(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "tide_fleet.infra.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**env, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def one_line_error(res: subprocess.CompletedProcess, *names: str) -> str:
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(("error: ", "tide ")) and "error: " in lines[0]
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def batch_file(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(LINE + "\n")
    return path


@pytest.fixture
def docs_folder(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("A short note.")
    return folder


def test_batch_run_and_docs_name_the_unreachable_gateway(batch_file, docs_folder, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    out = str(tmp_path / "out.jsonl")
    for args in (["run", str(batch_file), "-o", out], ["docs", str(docs_folder), "-o", out]):
        line = one_line_error(tide("batch", *args, "--url", url), url, "--url")
        assert line.startswith("error: cannot reach the gateway at ")


def test_a_missing_input_names_itself(tmp_path, batch_file):
    missing = str(tmp_path / "nope.jsonl")
    one_line_error(tide("batch", "run", missing, "-o", "x.jsonl"), "INPUT", "no such file", missing)
    one_line_error(tide("batch", "docs", missing), "FOLDER", "no such folder", missing)
    one_line_error(tide("batch", "docs", str(batch_file)), "FOLDER", "not a folder")


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("Summarize {doc}: {text}", "unknown field {doc}"),
        ("{} {text}", "unknown field {}"),
        ("{text.upper}", "unknown field {text.upper}"),
        ("{text:{width}}", "unknown field {width}"),
        ("a } {text}", "Single '}'"),
        ("no field", "must contain {text}"),
    ],
)
def test_a_template_with_another_field_is_one_line(docs_folder, template, says):
    one_line_error(
        tide("batch", "docs", str(docs_folder), "--template", template), "--template", says
    )


def test_literal_braces_and_a_format_spec_are_taken():
    from tide_fleet.infra.cli.option_types import text_template

    assert text_template("{{json}}: {text}").format(text="x") == "{json}: x"
    assert text_template("{text!r:>5}") == "{text!r:>5}"


def test_an_unknown_dtype_lists_the_accepted_spellings():
    line = one_line_error(tide("generate", "--dtype", "fp12"), "--dtype", "'fp12'", "fp16", "bf16")
    assert "fp8" not in line  # the engine has no fp8; the planner has
    line = one_line_error(
        tide("plan", "--model", "llama-2-7b", "--device", "h100", "--kv-dtype", "fp4"),
        "--kv-dtype", "fp8", "half",
    )  # fmt: skip
    one_line_error(tide("bench", "--dtype", "fp16"), "--dtype", "bfloat16 (or bf16)")


def test_plan_takes_fp16_as_float16():
    res = tide("plan", "--model", "llama-2-7b", "--memory-gb", "80GB",
               "--weight-dtype", "fp16", "--kv-dtype", "FP8", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["weight_dtype"] == "float16" and plan["kv_dtype"] == "fp8"
    assert plan["memory_bytes"] == 80 * 10**9


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["generate", "--kv-cache-memory", "64QB"], "--kv-cache-memory"),
        (["worker", "--kv-cache-memory=-1MiB"], "--kv-cache-memory"),
        (["up", "--kv-cache-memory", "1.5"], "--kv-cache-memory"),
        (["plan", "--model", "llama-2-7b", "--memory-gb", "lots"], "--memory-gb"),
        (["plan", "--model", "llama-2-7b", "--memory-gb", "0GB"], "--memory-gb"),
        (["plan", "--model", "llama-2-7b", "--device", "h100", "--kv-budget-gb", "-"],
         "--kv-budget-gb"),
    ],
)  # fmt: skip
def test_a_bad_size_names_its_option(argv, option):
    one_line_error(tide(*argv), f"argument {option}:")


def test_doctor_json_is_json_when_nothing_can_be_read(tmp_path):
    closed = free_port()
    res = tide("doctor", "--json", "--url", f"http://127.0.0.1:{closed}",
               "--redis-url", f"redis://127.0.0.1:{closed}/0",
               "--interval", "0.01", "--timeout", "0.5")  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr
    body = json.loads(res.stdout)
    assert body["findings"] == [] and body["workers"] == [] and not body["gateway"]
    assert any(e.startswith("redis: cannot read") for e in body["errors"])
    assert any(e.startswith("gateway: cannot read") for e in body["errors"])
    res = tide("doctor", "--json", "--load", str(tmp_path / "none"))
    assert res.returncode == 2 and "meta.json is missing" in json.loads(res.stdout)["errors"][0]
