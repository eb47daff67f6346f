"""``tide batch run --offline``: a batch file through an in-process engine, no fleet.

Each line is validated and planned exactly as the fleet plans it (``plan_line``: the same
request models, field checks, tools and response_format), its n choices run as engine
requests with the worker's ids and seeds (``tide_fleet.worker.choices``), and its output is rendered
by the same OpenAI renderers from a record shaped like the worker's result. Output lines
keep the input order. A line refused before it runs is written as the fleet writes one
(``refused_line``: the status, one message naming the field, ``param``); the checks the
fleet makes on the whole file (JSON, ``url``, ``body``) refuse only the line here.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.progress import Progress

from tide_fleet.infra.batches.finalize import refused_line
from tide_fleet.infra.batches.validate import ENDPOINTS, line_refusal, plan_line
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


def _read_lines(input_path: Path) -> list[Any]:
    """The file's non-blank lines as JSON; a line that is not JSON reads as None."""
    lines: list[Any] = []
    for raw in input_path.read_text().splitlines():
        if raw.strip():
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError:
                lines.append(None)
    return lines


def _envelope_problem(line: Any) -> tuple[str, str] | None:
    """(code, message) for a line the fleet would refuse with its whole file."""
    if not isinstance(line, dict):
        return "invalid_json", "not a JSON object (the file must be JSONL)"
    if line.get("url") not in ENDPOINTS:
        endpoints = " or ".join(ENDPOINTS)
        return "mismatched_url", f"url must be {endpoints}, got {line.get('url')!r}"
    if not isinstance(line.get("body"), dict):
        return "missing_body", "body must be a JSON object"
    return None


def _load(model: str, dtype: str | None) -> tuple[LLMEngine, ModelInfo]:
    """The engine and the tokenizer; a model that cannot load ends the command in one line."""
    try:
        folder = str(resolve_model_path(model))
        return LLMEngine.from_pretrained(folder, dtype=dtype), ModelInfo.load(folder)
    except (OSError, ValueError) as e:
        print(f"error: cannot load the model {model!r}: {' '.join(str(e).split())}",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2) from None


def run_offline(input_path: Path, output: Path, model: str, dtype: str | None) -> dict[str, int]:
    lines = _read_lines(input_path)
    engine, info = _load(model, dtype)
    entries = LogprobEntries(engine.tokenizer)
    results: dict[int, dict[str, Any]] = {}
    by_request: dict[str, tuple[_Line, Choice]] = {}
    for i, line in enumerate(lines):
        problem = _envelope_problem(line)
        if problem is not None:
            custom_id = line.get("custom_id") if isinstance(line, dict) else None
            results[i] = _refused(i, 400, problem[1], custom_id, None, problem[0])
            continue
        try:
            planned = plan_line(line["url"], line["body"], info, model)
            prompt = token_ids(info, planned.body, planned.tools)
            params = SamplingParams(**planned.body.sampling())
            engine.validate(len(prompt), params)
            record = {"id": f"offline-{i}", "prompt_tokens": len(prompt),
                      "created_at": time.time(), **_render(planned.fields)}  # fmt: skip
            entry = _Line(i, record, planned.body.n)
            for choice in entry.choices:
                engine.add_request(choice.request_id, prompt, choice_params(params, choice.index))
                by_request[choice.request_id] = (entry, choice)
        except (ValidationError, SubmissionError) as e:
            status, message, param = line_refusal(e)
            # the one model served: a line naming another is refused here, not the file
            code = "model_not_found" if getattr(e, "code", None) == "model_not_found" else None
            results[i] = _refused(i, status, message, line.get("custom_id"), param, code)
        except ValueError as e:  # engine.validate: the prompt and max_tokens against the context
            results[i] = _refused(i, 400, str(e), line.get("custom_id"), None)
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


def _refused(i: int, status: int, message: str, custom_id: str | None, param: str | None,
             code: str | None = None) -> dict[str, Any]:  # fmt: skip
    line = refused_line(status, message, custom_id, param, code or "invalid_request")
    return {"id": f"batch_req_offline_{i}", **line}
