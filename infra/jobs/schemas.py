"""Request bodies of the job API and the OpenAI-compatible routes (suffix: Create).

Request fields are strict where pydantic would coerce: no "8" for an int, no 1 for a bool,
no true for a number (a float field takes an int). Every string must be encodable as UTF-8:
JSON may carry a lone surrogate ("\\udfff") that no store or response can write.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from infra.wire.protocol import Priority

METADATA_MAX_KEYS = 16  # OpenAI's metadata limits
METADATA_KEY_MAX_CHARS = 64
METADATA_VALUE_MAX_CHARS = 512
STOP_MAX_COUNT = 8
STOP_MAX_CHARS = 256


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
_STOP_STRING: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": STOP_MAX_CHARS}
STOP_SCHEMA: dict[str, Any] = {
    "anyOf": [
        _STOP_STRING,
        {"type": "array", "items": _STOP_STRING, "maxItems": STOP_MAX_COUNT},
        {"type": "null"},
    ]
}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: Text


class WebhookSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: HttpUrl


class SamplingFields(BaseModel):
    """Sampling parameters shared by the job API and the OpenAI-compatible routes."""

    max_tokens: int = Field(64, ge=1, strict=True, description="tokens to generate, at least 1")
    temperature: float = Field(1.0, ge=0.0, le=100.0, strict=True)
    top_p: float = Field(1.0, gt=0.0, le=1.0, strict=True)
    top_k: int = Field(
        -1, strict=True, description="-1 (off) or at least 1",
        json_schema_extra={"minimum": -1, "not": {"const": 0}},
    )  # fmt: skip
    seed: int | None = Field(None, ge=0, lt=2**63, strict=True)
    stop: list[str] | str | None = Field(
        None, description=f"at most {STOP_MAX_COUNT}, each 1 to {STOP_MAX_CHARS} characters",
        json_schema_extra=STOP_SCHEMA,
    )  # fmt: skip
    ignore_eos: bool = Field(
        False, strict=True, description="keep generating past end-of-sequence tokens"
    )

    @field_validator("top_k")
    @classmethod
    def _top_k_on_or_off(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise PydanticCustomError("top_k", "must be -1 (off) or at least 1, got {v}", {"v": v})
        return v

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: list[str] | str | None) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > STOP_MAX_COUNT:
            raise PydanticCustomError(
                "stop_count", "at most {limit} stop strings, got {n}",
                {"limit": STOP_MAX_COUNT, "n": len(stops)},
            )  # fmt: skip
        for i, stop in enumerate(stops):
            if not stop:
                raise PydanticCustomError("stop_empty", "stop strings must be non-empty")
            if len(stop) > STOP_MAX_CHARS:
                raise PydanticCustomError(
                    "stop_too_long", "each stop string has at most {limit} characters; "
                    "stop[{i}] has {n}", {"limit": STOP_MAX_CHARS, "i": i, "n": len(stop)},
                )  # fmt: skip
            encodable(stop)
        return stops

    def sampling(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop or [],
            "ignore_eos": self.ignore_eos,
        }


class JobCreate(SamplingFields):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]},
    )
    prompt: NonEmptyText | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    priority: Priority = Priority.INTERACTIVE
    webhook: WebhookSpec | None = None
    metadata: Metadata | None = Field(None, max_length=METADATA_MAX_KEYS, description=METADATA_DOC)

    @model_validator(mode="after")
    def _one_input(self) -> JobCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self


# OpenAI-compatible request bodies (the routes and the batch API's lines).
class CompletionCreate(SamplingFields):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields Tide ignores
    model: Text | None = None
    prompt: NonEmptyText
    max_tokens: int = Field(16, ge=1, strict=True)
    stream: bool = Field(False, strict=True)


class ChatCompletionCreate(SamplingFields):
    model_config = ConfigDict(extra="ignore")
    model: Text | None = None
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int = Field(256, ge=1, strict=True)
    stream: bool = Field(False, strict=True)
