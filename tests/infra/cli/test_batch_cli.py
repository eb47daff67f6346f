"""`tide batch run --offline` and `tide batch docs --offline`: an in-process engine, no fleet."""

from __future__ import annotations

import json

from tide_fleet.infra.cli.batch_offline import run_offline
from tide_fleet.infra.cli.main import main


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


def test_run_offline_plans_lines_as_the_fleet_does(tmp_path, tiny_path):
    """n choices (seed + i), logprobs, echo and the field checks, offline as in the fleet."""
    src = tmp_path / "in.jsonl"
    body = {"prompt": "Once upon", "max_tokens": 4, "temperature": 1.0, "seed": 5}
    src.write_text("\n".join([
        _line("n", {**body, "n": 3, "logprobs": 2}),
        _line("echo", {**body, "echo": True}),
        _line("suffix", {**body, "suffix": "x"}),
        _line("model", {**body, "model": "not-this-one"}),
    ]) + "\n")  # fmt: skip
    out = tmp_path / "out.jsonl"
    counts = run_offline(src, out, str(tiny_path), "float32")
    assert counts == {"total": 4, "completed": 2, "failed": 2}
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    choices = rows[0]["response"]["body"]["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all("".join(c["logprobs"]["tokens"]) == c["text"] for c in choices)
    # dicts by token text: two ids that decode alike (bytes of one character) share a key
    assert all(1 <= len(top) <= 2 for c in choices for top in c["logprobs"]["top_logprobs"])
    assert rows[0]["response"]["body"]["usage"]["completion_tokens"] == 12
    assert rows[1]["response"]["body"]["choices"][0]["text"].startswith("Once upon")
    assert choices[0]["text"] == rows[1]["response"]["body"]["choices"][0]["text"][9:]  # seed
    assert "suffix" in rows[2]["error"]["message"]
    assert "not-this-one" in rows[3]["error"]["message"]


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


INVOICE = {
    "type": "object",
    "properties": {
        "number": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "total": {"type": "integer", "minimum": 0, "maximum": 100000},
        "paid": {"type": "boolean"},
    },
    "required": ["number", "total", "paid"],
    "additionalProperties": False,
}


def test_batch_docs_schema_writes_validated_json_per_document(tmp_path, tiny_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(4):
        (docs / f"invoice-{i}.txt").write_text(f"Invoice AB-{100 + i}, total {i * 50}, paid.")
    schema = tmp_path / "invoice.json"
    schema.write_text(json.dumps(INVOICE))
    out = tmp_path / "extracted.jsonl"
    argv = ["batch", "docs", str(docs), "--offline", "--model", str(tiny_path),
            "--template", "Extract the invoice as JSON:\n{text}\n", "--max-tokens", "120",
            "--schema", str(schema), "-o", str(out)]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in rows] == [f"invoice-{i}.txt" for i in range(4)]
    import jsonschema

    for row in rows:
        jsonschema.validate(row["data"], INVOICE)
    raw = [json.loads(x) for x in out.with_suffix(".batch.jsonl").read_text().splitlines()]
    assert all(r["response"]["status_code"] == 200 for r in raw)
    assert "4/4 documents as validated JSON" in capsys.readouterr().out


def test_batch_docs_schema_reports_an_output_cut_short(tmp_path, tiny_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Invoice AB-123")
    schema = tmp_path / "invoice.json"
    schema.write_text(json.dumps(INVOICE))
    out = tmp_path / "extracted.jsonl"
    argv = ["batch", "docs", str(docs), "--offline", "--model", str(tiny_path),
            "--max-tokens", "3", "--schema", str(schema), "-o", str(out)]  # fmt: skip
    assert main(argv) == 1
    [row] = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["custom_id"] == "a.txt" and "max_tokens" in row["error"]
    assert "a.txt: cut short" in capsys.readouterr().err


def test_batch_docs_refuses_a_file_that_is_no_json_schema(tmp_path, tiny_path):
    import pytest

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("x")
    schema = tmp_path / "bad.json"
    schema.write_text(json.dumps({"type": "objekt"}))
    argv = ["batch", "docs", str(docs), "--offline", "--model", str(tiny_path),
            "--schema", str(schema)]  # fmt: skip
    with pytest.raises(SystemExit, match="not a valid JSON Schema"):
        main(argv)
