"""The one encoder and decoder for Redis hashes (job, batch, file and heartbeat records).

A field is stored as a string: text as itself, None as "", a bool as "1" or "0", a number
as its ``repr`` (which round-trips a float exactly), anything else as JSON. A hash read
back is ``str -> str``; the reader converts the fields it knows.
"""

from __future__ import annotations

import json
from typing import Any


def encode_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value)


def decode_hash(raw: dict[bytes, bytes]) -> dict[str, str]:
    """A hash (or stream entry) as redis-py returns it, without decode_responses."""
    return {k.decode(): v.decode() for k, v in raw.items()}
