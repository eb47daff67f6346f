"""``tide batch run`` and ``tide batch docs``: batch files through the fleet or offline."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from rich.progress import Progress

from tide_fleet.infra.batches.docs import docs_to_batch
from tide_fleet.infra.batches.extract import extract, load_schema
from tide_fleet.infra.cli.client import client_flags, gateway_client
from tide_fleet.infra.cli.engine_flags import ENGINE_DTYPES
from tide_fleet.infra.cli.option_types import (
    dtype_help,
    dtype_option,
    existing_file,
    existing_folder,
    text_template,
)
from tide_fleet.infra.jobs.submission import ModelInfo

TEMPLATE_HELP = (
    "the prompt around each document: {text} is replaced by its text, and no other "
    "{field} is filled in (str.format rules: write {{ and }} for literal braces); "
    "default: 'Summarize:\\n{text}'"
)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    batch = sub.add_parser("batch", help="run OpenAI-format batch files; summarize documents")
    bsub = batch.add_subparsers(dest="batch_command", required=True)
    run = bsub.add_parser(
        "run",
        help="run a batch JSONL through the fleet, or --offline in this process",
        description="Input lines: {custom_id, method: POST, url, body}; output lines in input "
        "order: {id, custom_id, response: {status_code, request_id, body}, error}.",
    )
    run.add_argument("input", type=existing_file, metavar="INPUT")
    run.add_argument("-o", "--output", type=Path, required=True)
    run.add_argument("--offline", action="store_true", help="an in-process engine, no fleet")
    run.add_argument("--model", default=None, help="offline: HF folder or dummy:PRESET")
    run.add_argument("--dtype", default=None, type=dtype_option(*ENGINE_DTYPES), metavar="DTYPE",
                     help=f"offline: {dtype_help(*ENGINE_DTYPES)}")  # fmt: skip
    client_flags(run)
    run.set_defaults(func=cmd_batch_run)
    docs = bsub.add_parser(
        "docs",
        help="one request per .txt/.md file in a folder, submitted as a batch",
        description="Documents longer than the model's context are split on paragraph "
        "boundaries into chunks that fit (name#1, name#2, ...); every split is reported.",
    )
    docs.add_argument("folder", type=existing_folder, metavar="FOLDER")
    docs.add_argument("--template", type=text_template, default="Summarize:\n{text}",
                      help=TEMPLATE_HELP)  # fmt: skip
    docs.add_argument("--max-tokens", type=int, default=256)
    docs.add_argument("-o", "--output", type=Path, default=Path("docs_output.jsonl"))
    docs.add_argument("--model", default=None, help="for token counting (default: the fleet's)")
    docs.add_argument("--offline", action="store_true", help="an in-process engine, no fleet")
    docs.add_argument(
        "--schema", type=Path, default=None, metavar="FILE.json",
        help="a JSON Schema: every output is decoded to match it, and OUTPUT gets one line "
        "per document, {custom_id, data} (validated JSON) or {custom_id, error}; the raw "
        "batch output goes beside it as OUTPUT.batch.jsonl",
    )  # fmt: skip
    client_flags(docs)
    docs.set_defaults(func=cmd_batch_docs)


def _fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


@contextlib.contextmanager
def _one_line_os_errors() -> Iterator[None]:
    """A file that cannot be read or written ends the command with one line, exit 2."""
    try:
        yield
    except OSError as e:
        _fail(f"{e.filename}: {e.strerror}" if e.filename and e.strerror else str(e))


# -- running a batch file --------------------------------------------------------------------


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    with path.open("w") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")


def _endpoint(input_path: Path) -> str | None:
    """The first line's url: the batch's endpoint."""
    for n, raw in enumerate(input_path.read_text().splitlines(), 1):
        if raw.strip():
            try:
                first = json.loads(raw)
            except json.JSONDecodeError as e:
                _fail(f"{input_path}:{n}: not JSON ({e}); a batch file is JSONL")
            return first.get("url") if isinstance(first, dict) else None
    _fail(f"{input_path}: the file has no requests")


def run_fleet(input_path: Path, output: Path, url: str, api_key: str | None) -> dict[str, Any]:
    endpoint = _endpoint(input_path)
    with gateway_client(url, api_key, timeout=120) as client:
        with input_path.open("rb") as f:
            r = client.post(
                "/v1/files", files={"file": (input_path.name, f)}, data={"purpose": "batch"}
            )
        r.raise_for_status()
        body = {
            "input_file_id": r.json()["id"],
            "endpoint": endpoint,
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
    with _one_line_os_errors():
        return _batch_run(args)


def _batch_run(args: argparse.Namespace) -> int:
    if args.offline:
        from tide_fleet.infra.cli.batch_offline import run_offline  # loads torch: only when asked
        from tide_fleet.infra.settings import get_settings

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


def _docs_model(args: argparse.Namespace) -> tuple[str, ModelInfo]:
    """The model to count tokens with (--model, else the fleet's, else the settings') and
    its tokenizer."""
    from tide_fleet.infra.contract.registry import model_folder

    model = args.model
    if model is None and not args.offline:
        with gateway_client(args.url, args.api_key) as client:
            model = client.get("/v1/models").raise_for_status().json()["data"][0]["id"]
    if model is None:
        from tide_fleet.infra.settings import get_settings

        model = get_settings().model
    try:
        if model.startswith("dummy:"):
            from tide_fleet.worker.models.resolve import resolve_model_path

            resolve_model_path(model)
        return model, ModelInfo.load(str(model_folder(model)))
    except (OSError, ValueError) as e:
        _fail(f"cannot load the tokenizer of {model!r} ({' '.join(str(e).split())}); "
              "pass --model FOLDER")  # fmt: skip


def cmd_batch_docs(args: argparse.Namespace) -> int:
    with _one_line_os_errors():
        return _batch_docs(args)


def _batch_docs(args: argparse.Namespace) -> int:
    schema = load_schema(str(args.schema)) if args.schema else None
    model, info = _docs_model(args)
    lines, notes = docs_to_batch(args.folder, args.template, args.max_tokens, info, schema)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        tmp.write("\n".join(lines) + "\n")
    print(f"{len(lines)} requests from {args.folder}", file=sys.stderr)
    raw = args.output.with_suffix(".batch.jsonl") if schema is not None else args.output
    if args.offline:
        from tide_fleet.infra.cli.batch_offline import run_offline

        counts = run_offline(Path(tmp.name), raw, model, None)
        print(f"{counts['completed']}/{counts['total']} completed; output in {raw}")
        ok = counts["failed"] == 0
    else:
        batch = run_fleet(Path(tmp.name), raw, args.url, args.api_key)
        print(f"batch {batch['id']} {batch['status']}; output in {raw}")
        ok = batch["status"] == "completed"
    if schema is None:
        return 0 if ok else 1
    rows = extract([json.loads(x) for x in raw.read_text().splitlines() if x.strip()], schema)
    _write(args.output, rows)
    failed = [r for r in rows if "error" in r]
    for row in failed:
        print(f"{row['custom_id']}: {row['error']}", file=sys.stderr)
    print(f"{len(rows) - len(failed)}/{len(rows)} documents as validated JSON in {args.output}")
    return 0 if ok and not failed else 1
