"""``tide batch run --offline``: a batch file through an in-process engine, no fleet.

Each line is validated and planned exactly as the fleet plans it (``plan_line``: the same
request models, field checks, tools and response_format), its n choices run as engine
requests with the worker's ids and seeds (``tide_fleet.worker.choices``), and its output is rendered
by the same OpenAI renderers from a record shaped like the worker's result. Output lines
keep the input order.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.progress import Progress

from tide_fleet.infra.batches.validate import plan_line
from tide_fleet.infra.jobs.errors import SubmissionError
from tide_fleet.infra.jobs.openai_format import chat_body, completion_body
from tide_fleet.infra.jobs.submission import ModelInfo, token_ids
from tide_fleet.worker.choices import choice_params, request_id
from tide_fleet.worker.engine import LLMEngine, RequestOutput, SamplingParams
from tide_fleet.worker.held import Choice
from tide_fleet.worker.logprobs import LogprobEntries
from tide_fleet.worker.models.resolve import resolve_model_path

CHAT = "/v1/chat/completions"


class _Line:
    """One planned line: its record fields so far and its choices by engine request id."""

    def __init__(self, index: int, record: dict[str, Any], n: int) -> None:
        self.index, self.record = index, record
        self.choices = [Choice(i, request_id(record["id"], i, n)) for i in range(n)]

    def body(self, url: str, model: str) -> dict[str, Any]:
        first = self.choices[0]
        record = {**self.record, "text": first.text, "finish_reason": first.finish_reason,
                  "completion_tokens": sum(c.completion_tokens for c in self.choices),
                  "choices": json.dumps([c.wire() for c in self.choices])}  # fmt: skip
        return (chat_body if url == CHAT else completion_body)(record, model)


def run_offline(input_path: Path, output: Path, model: str, dtype: str | None) -> dict[str, int]:
    folder = resolve_model_path(model)
    engine = LLMEngine.from_pretrained(str(folder), dtype=dtype)
    info = ModelInfo.load(str(folder))
    entries = LogprobEntries(engine.tokenizer)
    lines = [json.loads(x) for x in input_path.read_text().splitlines() if x.strip()]
    results: dict[int, dict[str, Any]] = {}
    by_request: dict[str, tuple[_Line, Choice]] = {}
    for i, line in enumerate(lines):
        try:
            planned = plan_line(line.get("url", ""), line["body"], info, model)
            prompt = token_ids(info, planned.body, planned.tools)
            params = SamplingParams(**planned.body.sampling())
            engine.validate(len(prompt), params)
            record = {"id": f"offline-{i}", "prompt_tokens": len(prompt),
                      "created_at": time.time(), **_render(planned.fields)}  # fmt: skip
            entry = _Line(i, record, planned.body.n)
            for choice in entry.choices:
                engine.add_request(choice.request_id, prompt, choice_params(params, choice.index))
                by_request[choice.request_id] = (entry, choice)
        except (KeyError, ValidationError, SubmissionError, ValueError) as e:
            results[i] = _error_line(line, i, str(getattr(e, "message", e)))
    done = 0
    with Progress() as progress:
        task = progress.add_task("offline batch", total=len(lines))
        progress.update(task, completed=len(results))
        while engine.has_unfinished():
            for out in engine.step():
                if not out.finished:
                    continue
                entry, choice = by_request.pop(out.request_id)
                _finish(choice, out, entries)
                if all(c.done for c in entry.choices):
                    results[entry.index] = _output_line(lines[entry.index], entry, model)
                    done += results[entry.index]["error"] is None
                    progress.update(task, advance=1)
    with output.open("w") as f:
        for i in range(len(lines)):
            f.write(json.dumps(results[i], ensure_ascii=False) + "\n")
    return {"total": len(lines), "completed": done, "failed": len(lines) - done}


def _render(fields: dict[str, Any]) -> dict[str, str]:
    return {"render": json.dumps(fields["render"])} if fields.get("render") else {}


def _finish(choice: Choice, out: RequestOutput, entries: LogprobEntries) -> None:
    choice.done, choice.text = True, out.text
    choice.finish_reason, choice.error = out.finish_reason, out.error
    choice.completion_tokens = len(out.token_ids)
    if out.logprobs is not None:
        choice.logprobs = entries(out.logprobs)


def _output_line(line: dict[str, Any], entry: _Line, model: str) -> dict[str, Any]:
    failed = next((c for c in entry.choices if c.finish_reason not in ("stop", "length")), None)
    row_id = f"batch_req_offline_{entry.index}"
    if failed is not None:
        error = {"code": f"job_{failed.finish_reason}", "message": failed.error or ""}
        return {"id": row_id, "custom_id": line.get("custom_id"), "response": None,
                "error": error}  # fmt: skip
    body = entry.body(line["url"], model)
    response = {"status_code": 200, "request_id": entry.record["id"], "body": body}
    return {"id": row_id, "custom_id": line.get("custom_id"), "response": response,
            "error": None}  # fmt: skip


def _error_line(line: dict[str, Any], i: int, message: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_offline_{i}",
        "custom_id": line.get("custom_id"),
        "response": {"status_code": 400, "request_id": None, "body": None},
        "error": {"code": "invalid_request", "message": message},
    }
