"""Validated JSON per document: a ``tide batch docs --schema`` run's output, checked.

Constrained decoding makes every output that finished ("stop") valid by construction;
one cut short by max_tokens ("length") is not, and a failed line has no output at all.
Each is checked again here with `jsonschema` (an independent reader, not the grammar
library), so what is written as data is known to parse and validate.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema


def extract(outputs: list[dict[str, Any]], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per batch output line, in order: {custom_id, data} or {custom_id, error}."""
    validator = jsonschema.Draft202012Validator(schema)
    return [_row(line, validator) for line in outputs]


def _row(line: dict[str, Any], validator: jsonschema.protocols.Validator) -> dict[str, Any]:
    custom_id = line.get("custom_id")
    body = (line.get("response") or {}).get("body")
    if line.get("error") or not body:
        error = line.get("error") or {}
        return {"custom_id": custom_id, "error": error.get("message") or "no response"}
    choice = body["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    if choice.get("finish_reason") == "length":
        return {"custom_id": custom_id, "error": "cut short by max_tokens: raise --max-tokens"}
    try:
        data = json.loads(text)
        validator.validate(data)
    except (json.JSONDecodeError, jsonschema.ValidationError) as e:
        return {"custom_id": custom_id, "error": f"output does not validate: {e}"[:500]}
    if (where := _non_finite(data, "")) is not None:
        # Python reads 1e999 as infinity (and NaN/Infinity as themselves); no JSON carries it.
        return {
            "custom_id": custom_id,
            "error": f"output does not validate: {where or '$'}: "
            "a number out of a double's range (or NaN/Infinity), not JSON data",
        }
    return {"custom_id": custom_id, "data": data}


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first number in value that is not finite, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else path
    items = (
        value.items()
        if isinstance(value, dict)
        else (enumerate(value) if isinstance(value, list) else ())
    )
    for key, item in items:
        sub = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key}]"
        if (found := _non_finite(item, sub.lstrip("."))) is not None:
            return found
    return None


def load_schema(path: str) -> dict[str, Any]:
    """A JSON Schema file, checked as a schema (the fleet compiles it again for decoding)."""
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"--schema {path}: {e}") from None
    if not isinstance(schema, dict):
        raise SystemExit(f"--schema {path}: a JSON Schema is an object")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise SystemExit(f"--schema {path}: not a valid JSON Schema: {e.message}") from None
    return schema
