"""`tide batch run --offline` refuses a line as the fleet does: status, one message, param."""

from __future__ import annotations

import json

from tests.infra.cli.test_cli_errors import one_line_error, tide
from tide_fleet.infra.cli.batch_offline import run_offline


def _line(custom_id: str, body: dict, url: str = "/v1/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_refused_lines_are_shaped_as_the_fleets(tmp_path, tiny_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        _line("ok", {"prompt": "Once upon", "max_tokens": 2}),
        _line("type", {"prompt": "x", "max_tokens": "8"}),
        _line("suffix", {"prompt": "x", "suffix": "z"}),
        _line("model", {"prompt": "x", "model": "not-this-one"}),
        _line("url", {"prompt": "x"}, url="/v1/embeddings"),
        json.dumps({"custom_id": "nobody", "method": "POST", "url": "/v1/completions"}),
        "{not json",
        _line("long", {"prompt": "word " * 3000, "max_tokens": 4}),
    ]) + "\n")  # fmt: skip
    out = tmp_path / "out.jsonl"
    counts = run_offline(src, out, str(tiny_path), "float32")
    assert counts == {"total": 8, "completed": 1, "failed": 7}
    rows = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert rows["ok"]["error"] is None
    for row in [r for r in rows.values() if r["error"] is not None]:
        assert set(row["error"]) == {"code", "message", "param"}
        assert "\n" not in row["error"]["message"] and row["error"]["message"]
        assert row["response"]["body"] is None and row["id"].startswith("batch_req_offline_")
    errors = {k: r["error"] for k, r in rows.items()}
    assert errors["type"]["param"] == "body.max_tokens"
    assert errors["type"]["message"].startswith("body.max_tokens: ")
    assert errors["type"]["code"] == "invalid_request"
    assert rows["type"]["response"]["status_code"] == 400
    assert errors["suffix"]["param"] == "body.suffix"
    assert errors["model"]["code"] == "model_not_found"
    assert errors["model"]["param"] == "body.model"
    assert "not-this-one" in errors["model"]["message"]
    assert (
        errors["url"]["code"] == "mismatched_url" and "/v1/embeddings" in errors["url"]["message"]
    )
    assert errors["nobody"]["code"] == "missing_body"
    assert errors[None]["code"] == "invalid_json"
    assert errors["long"]["code"] == "invalid_request" and "context" in errors["long"]["message"]


def test_a_model_that_cannot_load_is_one_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(_line("a", {"prompt": "x"}) + "\n")
    res = tide("batch", "run", str(src), "-o", str(tmp_path / "o.jsonl"), "--offline",
               "--model", "dummy:nope")  # fmt: skip
    one_line_error(res, "dummy:nope")
