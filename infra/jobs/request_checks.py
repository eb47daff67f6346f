"""Checks of a request that need the model or join fields: token ids in the vocabulary,
min_tokens within max_tokens, and the structured-output grammar compiled (torch-free,
``tide_fleet.infra.contract.structured.validate``) before anything is queued.

Validation is cached by the spec's ``cache_key``: a batch of 10,000 lines with one schema
compiles it once.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from tide_fleet.infra.contract.structured import StructuredOutput, as_structured, validate
from tide_fleet.infra.jobs.errors import bad_request
from tide_fleet.infra.jobs.schemas import JobCreate

STRUCTURED_CACHE = 1024


@functools.lru_cache(maxsize=STRUCTURED_CACHE)
def _compile_error(key: str) -> str | None:
    try:
        validate(StructuredOutput.from_dict(json.loads(key)))
    except ValueError as e:
        return str(e)
    return None


def check_structured(spec: dict[str, Any] | StructuredOutput, param: str) -> None:
    """Raise a 400 naming `param` and the problem unless the spec compiles."""
    try:
        structured = as_structured(spec)
    except ValueError as e:
        raise bad_request(param, str(e), "invalid_response_format") from None
    error = _compile_error(structured.cache_key())
    if error is not None:
        raise bad_request(param, f"the grammar does not compile: {error}", "invalid_schema")


def structured_param(body: JobCreate) -> str:
    if body.structured is not None:
        return "structured"
    return "response_format"


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    for j, t in enumerate(ids):
        if t >= vocab_size:
            raise bad_request(
                param, f"token id {t} (at {j}) is not in the vocabulary of {vocab_size} tokens",
                "invalid_token_id",
            )  # fmt: skip


def check_sampling(body: JobCreate, vocab_size: int) -> None:
    """What pydantic cannot know: the vocabulary, and min_tokens against max_tokens."""
    if body.logit_bias:
        check_token_ids([int(k) for k in body.logit_bias], vocab_size, "logit_bias")
    if body.min_tokens > body.max_tokens:
        raise bad_request(
            "min_tokens", f"{body.min_tokens} is more than max_tokens ({body.max_tokens})"
        )
    spec = body.structured_spec()
    if spec is not None:
        check_structured(spec, structured_param(body))
