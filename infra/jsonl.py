"""Reading the JSONL files users hand to Tide (prompts, traces): one object a line, errors
that name the file, the line and the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_objects(
    path: str | Path, allowed: set[str] | frozenset[str]
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; ValueError("path:n: ...") for a line
    that is not JSON, not an object, or has a field outside `allowed`."""
    try:
        f = open(path)  # noqa: SIM115 (closed below; errors name the path)
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(item, dict):
                raise ValueError(f"{path}:{n}: each line must be a JSON object")
            unknown = set(item) - allowed
            if unknown:
                raise ValueError(
                    f"{path}:{n}: unknown fields {sorted(unknown)} (allowed: {sorted(allowed)})"
                )
            yield n, item
