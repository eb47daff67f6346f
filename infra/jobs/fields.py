"""Field types shared by the request bodies: strict, UTF-8-encodable text, metadata, prompts
(text or token ids), logit bias, and the refusal of a field Tide does not serve.

Every check here raises PydanticCustomError, so the error's `loc` is the field and its
`type` a short code: the gateway turns both into the error object's `param` and `code`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

METADATA_MAX_KEYS = 16  # OpenAI's metadata limits
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512
MAX_PROMPTS = 64  # completions: prompts in one request (each is its own job)
MAX_PROMPT_IDS = 1 << 20  # token ids in one prompt, before the context check


def encodable(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PydanticCustomError(
            "string_unicode",
            "holds a lone surrogate (U+{code}) at character {position}, which cannot be "
            "encoded as UTF-8",
            {"code": f"{ord(value[e.start]):04X}", "position": e.start},
        ) from None
    return value


def _encodable_input(value: object) -> object:
    # Before the str schema: pydantic's own check of a length says less ("unable to parse").
    return encodable(value) if isinstance(value, str) else value


Text = Annotated[str, BeforeValidator(_encodable_input)]
NonEmptyText = Annotated[str, Field(min_length=1), BeforeValidator(_encodable_input)]
Metadata = dict[
    Annotated[str, Field(max_length=METADATA_KEY_MAX_CHARS), BeforeValidator(_encodable_input)],
    Annotated[str, Field(max_length=METADATA_VALUE_MAX_CHARS), BeforeValidator(_encodable_input)],
]
METADATA_DOC = (
    f"at most {METADATA_MAX_KEYS} keys of at most {METADATA_KEY_MAX_CHARS} characters, "
    f"values of at most {METADATA_VALUE_MAX_CHARS}"
)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _error(code: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(code, message)  # no context: the message is not a template


def _token_ids(value: list[Any], where: str) -> list[int]:
    """`where` names a prompt of a list ("prompt[2] "), or is empty for the prompt itself."""
    if not value:
        raise _error("empty_prompt", f"{where}List should have at least 1 item")
    if len(value) > MAX_PROMPT_IDS:
        raise _error("context_length_exceeded", f"{where}has over {MAX_PROMPT_IDS} token ids")
    for j, t in enumerate(value):
        if not _is_int(t) or t < 0:
            raise _error(
                "invalid_token_id",
                f"{where}[{j}] is not a token id (an integer >= 0): {repr(t)[:40]}",
            )
    return value


def _one_prompt(value: object, where: str) -> str | list[int]:
    if isinstance(value, str):
        if not value:
            raise _error("string_too_short", f"{where}String should have at least 1 character")
        return encodable(value)
    if isinstance(value, list):
        return _token_ids(value, where)
    raise _error(
        "invalid_prompt",
        f"{where}must be a string or a list of token ids, got {type(value).__name__}",
    )


def single_prompt(value: object) -> object:
    """The job API's prompt: a string or one list of token ids."""
    return None if value is None else _one_prompt(value, "")


def check_prompts(value: object) -> object:
    """Completions' prompt, as given (checked by ``prompt_list``)."""
    prompt_list(value)
    return value


def prompt_list(value: object) -> list[str | list[int]]:
    """Completions' prompt: a string, a list of strings, a list of token ids, or a list of
    lists of token ids; as a list of prompts (each a string or a list of ids)."""
    if isinstance(value, list) and value and all(_is_int(t) for t in value):
        return [_token_ids(value, "")]
    if not isinstance(value, list):
        return [_one_prompt(value, "")]
    if not value:
        raise _error("empty_prompt", "List should have at least 1 item")
    if len(value) > MAX_PROMPTS:
        raise _error(
            "too_many_prompts", f"at most {MAX_PROMPTS} prompts in one request, got {len(value)}"
        )
    return [_one_prompt(p, f"prompt[{i}]: ") for i, p in enumerate(value)]


PROMPT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1,
         "maxItems": MAX_PROMPTS},
        {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
        {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS,
         "items": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}},
    ]
}  # fmt: skip


def parse_logit_bias(value: object) -> dict[str, float] | None:
    """{"<token id>": bias in [-100, 100]}; whether the id is in the vocabulary is checked
    with the model (infra/jobs/request_checks.py)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "must be an object of token id -> bias")
    out: dict[str, float] = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise PydanticCustomError(
                "invalid_logit_bias", "key {key} is not a token id", {"key": repr(key)[:40]}
            )
        if not isinstance(bias, int | float) or isinstance(bias, bool) or not -100 <= bias <= 100:
            raise PydanticCustomError(
                "invalid_logit_bias", "the bias of token {key} must be a number in "
                "[-100, 100], got {bias}", {"key": key, "bias": repr(bias)[:40]},
            )  # fmt: skip
        out[str(int(key))] = float(bias)
    return out


LOGIT_BIAS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "propertyNames": {"pattern": "^[0-9]+$"},
    "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
}


REFUSED_KEY = "x-tide-refused"


def refused_field(why: str, *allowed: Any) -> Any:
    """A field Tide does not serve: null (absent) or one of `allowed` passes, anything else is
    a 400 naming the field (``check_refused``). Its schema says so."""
    schema: dict[str, Any] = {"enum": [*allowed, None]} if allowed else {"type": "null"}
    return Field(
        None, description=f"refused: {why}",
        json_schema_extra={**schema, REFUSED_KEY: {"why": why, "allowed": list(allowed)}},
    )  # fmt: skip


def check_refused(field: FieldInfo, value: Any) -> Any:
    """Pass `value` unless `field` is a refused one and `value` is not allowed."""
    extra = field.json_schema_extra
    refusal = extra.get(REFUSED_KEY) if isinstance(extra, dict) else None
    if not isinstance(refusal, dict) or value is None:
        return value
    allowed: list[Any] = list(refusal["allowed"] or [])  # type: ignore[arg-type]
    if any(value == a and type(value) is type(a) for a in allowed):
        return value
    raise PydanticCustomError(
        "unsupported_value" if allowed else "unsupported_parameter",
        "not supported by Tide: {why}", {"why": refusal["why"]},
    )  # fmt: skip
