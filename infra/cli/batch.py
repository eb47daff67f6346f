"""``tide batch run`` and ``tide batch docs``: batch files through the fleet or offline."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError
from rich.progress import Progress

from infra.batches.docs import docs_to_batch
from infra.jobs.openai_format import chat_body, completion_body
from infra.jobs.schemas import ChatCompletionCreate
from infra.jobs.submission import ModelInfo, SubmissionError, token_ids


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    batch = sub.add_parser("batch", help="run OpenAI-format batch files; summarize documents")
    bsub = batch.add_subparsers(dest="batch_command", required=True)
    run = bsub.add_parser(
        "run",
        help="run a batch JSONL through the fleet, or --offline in this process",
        description="Input lines: {custom_id, method: POST, url, body}; output lines in input "
        "order: {id, custom_id, response: {status_code, request_id, body}, error}.",
    )
    run.add_argument("input", type=Path)
    run.add_argument("-o", "--output", type=Path, required=True)
    run.add_argument("--offline", action="store_true", help="an in-process engine, no fleet")
    run.add_argument("--model", default=None, help="offline: HF folder or dummy:PRESET")
    run.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    _fleet_flags(run)
    run.set_defaults(func=cmd_batch_run)
    docs = bsub.add_parser(
        "docs",
        help="one request per .txt/.md file in a folder, submitted as a batch",
        description="Documents longer than the model's context are split on paragraph "
        "boundaries into chunks that fit (name#1, name#2, ...); every split is reported.",
    )
    docs.add_argument("folder", type=Path)
    docs.add_argument("--template", default="Summarize:\n{text}", help="must contain {text}")
    docs.add_argument("--max-tokens", type=int, default=256)
    docs.add_argument("-o", "--output", type=Path, default=Path("docs_output.jsonl"))
    docs.add_argument("--model", default=None, help="for token counting (default: the fleet's)")
    docs.add_argument("--offline", action="store_true", help="an in-process engine, no fleet")
    _fleet_flags(docs)
    docs.set_defaults(func=cmd_batch_docs)


def _fleet_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="gateway base URL")
    p.add_argument("--api-key", default=None)


# -- running a batch file --------------------------------------------------------------------


def run_offline(input_path: Path, output: Path, model: str, dtype: str | None) -> dict[str, int]:
    from infra.batches.validate import ENDPOINTS
    from worker.engine import LLMEngine, SamplingParams
    from worker.models.resolve import resolve_model_path

    folder = resolve_model_path(model)
    engine = LLMEngine.from_pretrained(str(folder), dtype=dtype)
    info = ModelInfo.load(str(folder))
    lines = [json.loads(x) for x in input_path.read_text().splitlines() if x.strip()]
    results: dict[int, dict[str, Any]] = {}
    ids: dict[str, int] = {}
    for i, line in enumerate(lines):
        try:
            request = ENDPOINTS[line["url"]].model_validate(line["body"])
            job = _as_job(request)
            prompt = token_ids(info, job)
            params = SamplingParams(
                **{k: v for k, v in request.sampling().items() if v is not None}
            )
            engine.validate(len(prompt), params)
            rid = f"offline-{i}-{uuid.uuid4().hex[:8]}"
            engine.add_request(rid, prompt, params)
            ids[rid] = i
        except (KeyError, ValidationError, SubmissionError, ValueError) as e:
            results[i] = _error_line(line, i, str(getattr(e, "message", e)))
    done = 0
    with Progress() as progress:
        task = progress.add_task("offline batch", total=len(lines))
        progress.update(task, completed=len(results))
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    i = ids[out.request_id]
                    results[i] = _output_line(lines[i], i, out, len(out.prompt_token_ids), model)
                    done += 1
                    progress.update(task, advance=1)
    _write(output, [results[i] for i in range(len(lines))])
    return {"total": len(lines), "completed": done, "failed": len(lines) - done}


def _as_job(request: Any) -> Any:
    from infra.jobs.schemas import JobCreate

    if isinstance(request, ChatCompletionCreate):
        return JobCreate(**request.sampling(), messages=request.messages)
    return JobCreate(**request.sampling(), prompt=request.prompt)


def _output_line(
    line: dict[str, Any], i: int, out: Any, n_prompt: int, model: str
) -> dict[str, Any]:
    record = {
        "id": out.request_id,
        "text": out.text,
        "finish_reason": out.finish_reason,
        "prompt_tokens": str(n_prompt),
        "completion_tokens": str(len(out.token_ids)),
        "created_at": str(time.time()),
    }
    body = (chat_body if line["url"] == "/v1/chat/completions" else completion_body)(record, model)
    ok = out.finish_reason in ("stop", "length")
    return {
        "id": f"batch_req_offline_{i}",
        "custom_id": line.get("custom_id"),
        "response": {"status_code": 200, "request_id": out.request_id, "body": body}
        if ok
        else None,
        "error": None if ok else {"code": f"job_{out.finish_reason}", "message": out.error or ""},
    }


def _error_line(line: dict[str, Any], i: int, message: str) -> dict[str, Any]:
    return {
        "id": f"batch_req_offline_{i}",
        "custom_id": line.get("custom_id"),
        "response": {"status_code": 400, "request_id": None, "body": None},
        "error": {"code": "invalid_request", "message": message},
    }


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def run_fleet(input_path: Path, output: Path, url: str, api_key: str | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    first = json.loads(next(x for x in input_path.read_text().splitlines() if x.strip()))
    with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
        with input_path.open("rb") as f:
            r = client.post(
                "/v1/files", files={"file": (input_path.name, f)}, data={"purpose": "batch"}
            )
        r.raise_for_status()
        body = {
            "input_file_id": r.json()["id"],
            "endpoint": first.get("url"),
            "completion_window": "24h",
        }
        batch = client.post("/v1/batches", json=body).raise_for_status().json()
        with Progress() as progress:
            task = progress.add_task(f"batch {batch['id']}", total=None)
            while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
                time.sleep(0.5)
                batch = client.get(f"/v1/batches/{batch['id']}").raise_for_status().json()
                counts = batch["request_counts"]
                progress.update(
                    task,
                    total=counts["total"] or None,
                    completed=counts["completed"] + counts["failed"],
                )
        if batch["status"] == "failed":
            raise SystemExit(f"batch failed: {json.dumps(batch['errors'])}")
        lines: list[bytes] = []
        for key in ("output_file_id", "error_file_id"):
            if batch.get(key):
                lines += (
                    client.get(f"/v1/files/{batch[key]}/content")
                    .raise_for_status()
                    .content.splitlines()
                )
    by_index = sorted(lines, key=lambda x: int(json.loads(x)["id"].rsplit("_", 1)[1]))
    output.write_bytes(b"".join(x + b"\n" for x in by_index))
    return batch


def cmd_batch_run(args: argparse.Namespace) -> int:
    if args.offline:
        from infra.settings import get_settings

        counts = run_offline(
            args.input, args.output, args.model or get_settings().model, args.dtype
        )
        print(f"{counts['completed']}/{counts['total']} completed; output in {args.output}")
        return 0 if counts["failed"] == 0 else 1
    batch = run_fleet(args.input, args.output, args.url, args.api_key)
    counts = batch["request_counts"]
    print(f"batch {batch['id']} {batch['status']}: {counts['completed']}/{counts['total']} "
          f"completed; output in {args.output}")  # fmt: skip
    return 0 if batch["status"] == "completed" and counts["failed"] == 0 else 1


# -- documents -------------------------------------------------------------------------------


def cmd_batch_docs(args: argparse.Namespace) -> int:
    from worker.models.registry import model_folder

    model = args.model
    if model is None and not args.offline:
        headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
        model = (
            httpx.get(f"{args.url}/v1/models", headers=headers)
            .raise_for_status()
            .json()["data"][0]["id"]
        )
    if model is None:
        from infra.settings import get_settings

        model = get_settings().model
    if model.startswith("dummy:"):
        from worker.models.resolve import resolve_model_path

        resolve_model_path(model)
    info = ModelInfo.load(str(model_folder(model)))
    lines, notes = docs_to_batch(args.folder, args.template, args.max_tokens, info)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        tmp.write("\n".join(lines) + "\n")
    print(f"{len(lines)} requests from {args.folder}", file=sys.stderr)
    if args.offline:
        counts = run_offline(Path(tmp.name), args.output, model, None)
        print(f"{counts['completed']}/{counts['total']} completed; output in {args.output}")
        return 0
    batch = run_fleet(Path(tmp.name), args.output, args.url, args.api_key)
    print(f"batch {batch['id']} {batch['status']}; output in {args.output}")
    return 0 if batch["status"] == "completed" else 1
