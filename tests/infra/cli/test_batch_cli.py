"""`tide batch run --offline` and `tide batch docs --offline`: an in-process engine, no fleet."""

from __future__ import annotations

import json

from infra.cli.batch import run_offline
from infra.cli.main import main


def _line(custom_id: str, body: dict, url: str = "/v1/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def test_run_offline_keeps_input_order_and_reports_bad_lines(tmp_path, tiny_path):
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join([
        _line("a", {"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}),
        _line("b", {"prompt": "x", "top_k": 0}),
        _line("c", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
              url="/v1/chat/completions"),
    ]) + "\n")  # fmt: skip
    out = tmp_path / "out.jsonl"
    counts = run_offline(src, out, str(tiny_path), "float32")
    assert counts == {"total": 3, "completed": 2, "failed": 1}
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == ["a", "b", "c"]
    assert rows[0]["response"]["body"]["usage"]["completion_tokens"] == 3
    assert (
        rows[1]["response"]["status_code"] == 400 and rows[1]["error"]["code"] == "invalid_request"
    )
    assert rows[2]["response"]["body"]["object"] == "chat.completion"


def test_batch_docs_offline(tmp_path, tiny_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "one.txt").write_text("A short note.")
    (docs / "two.md").write_text("Another note.")
    out = tmp_path / "out.jsonl"
    argv = ["batch", "docs", str(docs), "--offline", "--model", str(tiny_path),
            "--max-tokens", "2", "-o", str(out)]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == ["one.txt", "two.md"]
    assert "2 requests from" in capsys.readouterr().err
