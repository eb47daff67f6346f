"""The `tide generate` contract that other checks rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT


def tide(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tide_fleet.infra.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=check,
        timeout=300,
    )


def test_generate_json_in_input_order(tmp_path, stories_path, stories_refs):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps({"prompt": r["prompt"], "max_tokens": r["max_new_tokens"]})
            for r in stories_refs
        )
    )
    res = tide(
        "generate", "--model", str(stories_path), "--prompt", "The little dog",
        "--prompts-file", str(prompts), "--max-tokens", "5", "--dtype", "float32", "--json",
    )  # fmt: skip
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert len(lines) == 1 + len(stories_refs)
    assert lines[0]["prompt"] == "The little dog" and len(lines[0]["token_ids"]) == 5
    for ref, got in zip(stories_refs, lines[1:], strict=True):
        assert set(got) == {"prompt", "text", "prompt_token_ids", "token_ids", "finish_reason"}
        assert got["prompt"] == ref["prompt"]
        assert got["prompt_token_ids"] == ref["prompt_ids"]
        assert got["token_ids"] == ref["new_ids"]
        assert got["text"] == ref["continuation"]
        assert got["finish_reason"] == "length"


def test_generate_on_dummy_model_with_sampling():
    res = tide(
        "generate", "--model", "dummy:tiny", "--prompt", "hi", "--max-tokens", "7",
        "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20", "--seed", "3",
        "--ignore-eos", "--json",
    )  # fmt: skip
    out = json.loads(res.stdout)
    assert len(out["token_ids"]) == 7 and out["finish_reason"] == "length"


def test_bad_input_is_a_clear_error(tmp_path):
    res = tide("generate", "--model", "dummy:tiny", "--prompt", "x" * 2000, check=False)
    assert res.returncode == 2 and "model's context is 1024" in res.stderr
    res = tide(
        "generate", "--model", "dummy:tiny", "--prompt", "x", "--max-tokens", "0", check=False
    )
    assert res.returncode == 2 and "max_tokens must be at least 1" in res.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": 3}\n')
    res = tide("generate", "--prompts-file", str(bad), check=False)
    assert res.returncode != 0 and "bad.jsonl:2" in res.stderr
    res = tide("generate", "--model", "dummy:nope", "--prompt", "x", check=False)
    assert res.returncode == 2 and "unknown dummy preset 'nope'" in res.stderr
