"""Trace files: JSONL, one request a line, read by ``tide simulate`` (jobs of a fleet's day)
and ``tide bench`` (the requests to send). One reader for both formats; errors name the
file, the line and the field.

- A job trace (``tide simulate --trace``): ``{"arrival_s", "prompt_tokens", "max_tokens",
  "output_tokens"?, "model"?, "deadline"? | "completion_window"?, "id"?}``; output_tokens
  (what the job really generates) defaults to max_tokens and may not exceed it; model is
  the served name (or alias) a client would send, absent for the fleet's default model
  (the simulator resolves it); deadline (seconds from the start, as arrival_s, after it) or
  completion_window (the API's form, "24h", "30m", from arrival_s) makes it a batch job,
  due then; id is ignored.
- A request trace (``tide bench --trace``): ``{"prompt" | "prompt_len", "max_tokens",
  "offset"?}``; offset (seconds after the start) on every line or on none.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tide_fleet.infra.jobs.deadlines import parse_window
from tide_fleet.infra.jsonl import iter_objects

JOB_TRACE_FIELDS = frozenset({
    "arrival_s", "prompt_tokens", "max_tokens", "output_tokens", "model", "deadline",
    "completion_window", "id",
})  # fmt: skip
REQUEST_TRACE_FIELDS = frozenset({"prompt", "prompt_len", "max_tokens", "offset"})

Row = TypeVar("Row")


class TraceError(ValueError):
    """A trace that cannot be used; the message names the file, the line and the field."""


@dataclass(frozen=True)
class JobRow:
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    model: str | None = None  # as the trace names it; None: the fleet's default model
    deadline: float | None = None  # due by (seconds from the start); None: interactive
    line: int = field(default=0, compare=False)  # in the file, for errors that name it


@dataclass
class RequestRow:
    max_tokens: int
    prompt: str | None = None
    prompt_len: int | None = None
    offset: float | None = None


def read_job_trace(path: str | Path) -> list[JobRow]:
    """Every job of a job trace, in file order (possibly none)."""
    return _read(path, JOB_TRACE_FIELDS, _job_row)


def read_request_trace(path: str | Path) -> list[RequestRow]:
    """Every request of a request trace, in file order; at least one."""
    rows = _read(path, REQUEST_TRACE_FIELDS, _request_row)
    if not rows:
        raise TraceError(f"{path}: the trace has no requests")
    with_offset = sum(r.offset is not None for r in rows)
    if 0 < with_offset < len(rows):
        raise TraceError(
            f"{path}: give offset on every line or on none ({with_offset} of {len(rows)} have it)"
        )
    return rows


def _read(
    path: str | Path, fields: frozenset[str], parse: Callable[[dict[str, Any], int, str], Row]
) -> list[Row]:
    try:
        return [parse(item, n, f"{path}:{n}") for n, item in iter_objects(path, fields)]
    except TraceError:
        raise
    except ValueError as e:  # the JSONL reader's: not JSON, not an object, unknown field
        raise TraceError(str(e)) from None


def _is_count(v: Any) -> bool:
    return type(v) is int and v >= 1


def _is_seconds(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and 0 <= v < math.inf


def _job_row(item: dict[str, Any], line: int, where: str) -> JobRow:
    t: Any = item.get("arrival_s")
    if not _is_seconds(t):
        raise TraceError(f"{where}: field arrival_s must be a number >= 0, got {t!r}")
    counts: dict[str, int] = {}
    for key in ("prompt_tokens", "max_tokens", "output_tokens"):
        v: Any = item.get(key, item.get("max_tokens") if key == "output_tokens" else None)
        if not _is_count(v):
            raise TraceError(f"{where}: field {key} must be an integer >= 1, got {v!r}")
        counts[key] = v
    if counts["output_tokens"] > counts["max_tokens"]:
        raise TraceError(
            f"{where}: field output_tokens ({counts['output_tokens']}) exceeds max_tokens "
            f"({counts['max_tokens']})"
        )
    model: Any = item.get("model")
    if "model" in item and not _is_name(model):
        raise TraceError(f"{where}: field model must be a model name (a string, no spaces), got "
                         f"{model!r}")  # fmt: skip
    return JobRow(float(t), **counts, model=model, deadline=_deadline(item, t, where), line=line)


def _deadline(item: dict[str, Any], arrival: float, where: str) -> float | None:
    """The job's deadline, seconds from the start: `deadline` as written, or arrival plus
    `completion_window`; None without either."""
    if "deadline" in item and "completion_window" in item:
        raise TraceError(f"{where}: field completion_window: give deadline or "
                         "completion_window, not both")  # fmt: skip
    if "completion_window" in item:
        window: Any = item["completion_window"]
        try:
            seconds = parse_window(window) if isinstance(window, str) else 0
        except ValueError:
            seconds = 0  # parse_window's are >= 1
        if not seconds:
            raise TraceError(f"{where}: field completion_window must be a duration like "
                             f"'24h', '6h' or '30m', got {window!r}")  # fmt: skip
        return arrival + seconds
    if "deadline" not in item:
        return None
    due: Any = item["deadline"]
    if not _is_seconds(due) or due <= arrival:
        raise TraceError(f"{where}: field deadline must be a number of seconds from the start "
                         f"after arrival_s ({arrival:g}), got {due!r}")  # fmt: skip
    return float(due)


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and bool(v) and not any(c.isspace() for c in v)


def _request_row(item: dict[str, Any], line: int, where: str) -> RequestRow:
    if ("prompt" in item) == ("prompt_len" in item):
        raise TraceError(f"{where}: give exactly one of prompt or prompt_len")
    if "prompt" in item and (not isinstance(item["prompt"], str) or not item["prompt"]):
        raise TraceError(f"{where}: prompt must be a non-empty string")
    for key in ("prompt_len", "max_tokens"):
        if key in item and not _is_count(item[key]):
            raise TraceError(f"{where}: {key} must be an integer >= 1, got {item[key]!r}")
    if "max_tokens" not in item:
        raise TraceError(f"{where}: max_tokens is required")
    offset = item.get("offset")
    if offset is not None and (
        isinstance(offset, bool) or not isinstance(offset, int | float) or offset < 0
    ):
        raise TraceError(f"{where}: offset must be a number of seconds >= 0, got {offset!r}")
    return RequestRow(item["max_tokens"], item.get("prompt"), item.get("prompt_len"), offset)
