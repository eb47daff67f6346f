"""The sampling and output options every request body shares (the job API's and the
OpenAI routes'): what the engine's SamplingParams takes, strict, with their limits, and
``sampling()``, the record's wire form (an option only when it is on)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from tide_fleet.infra.jobs.fields import LOGIT_BIAS_SCHEMA, encodable, parse_logit_bias
from tide_fleet.infra.jobs.response_format import ResponseFormat

STOP_MAX_COUNT = 8
STOP_MAX_CHARS = 256
MAX_N = 16  # choices per prompt
_STOP_STRING: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": STOP_MAX_CHARS}
STOP_SCHEMA: dict[str, Any] = {
    "anyOf": [
        _STOP_STRING,
        {"type": "array", "items": _STOP_STRING, "maxItems": STOP_MAX_COUNT},
        {"type": "null"},
    ]
}


def _penalty(default: float) -> Any:
    return Field(default, ge=-2.0, le=2.0, strict=True, allow_inf_nan=False)


class SamplingFields(BaseModel):
    """Sampling parameters shared by the job API and the OpenAI-compatible routes."""

    max_tokens: int = Field(64, ge=1, strict=True, description="tokens to generate, at least 1")
    temperature: float = Field(1.0, ge=0.0, le=100.0, strict=True)
    top_p: float = Field(1.0, gt=0.0, le=1.0, strict=True)
    top_k: int = Field(
        -1, strict=True, description="-1 (off) or at least 1",
        json_schema_extra={"minimum": -1, "not": {"const": 0}},
    )  # fmt: skip
    seed: int | None = Field(
        None, ge=0, lt=2**63, strict=True, description="choice i samples with seed + i"
    )
    stop: list[str] | str | None = Field(
        None, description=f"at most {STOP_MAX_COUNT}, each 1 to {STOP_MAX_CHARS} characters; "
        "the matched text is not returned", json_schema_extra=STOP_SCHEMA,
    )  # fmt: skip
    ignore_eos: bool = Field(
        False, strict=True, description="keep generating past end-of-sequence tokens"
    )
    n: int = Field(1, ge=1, le=MAX_N, strict=True, description="choices per prompt")
    presence_penalty: float = _penalty(0.0)
    frequency_penalty: float = _penalty(0.0)
    repetition_penalty: float = Field(
        1.0, gt=0.0, le=100.0, strict=True, allow_inf_nan=False, description="1 is off"
    )
    logit_bias: Annotated[
        dict[str, float] | None,
        BeforeValidator(parse_logit_bias),
        WithJsonSchema(LOGIT_BIAS_SCHEMA),
    ] = Field(None, description="token id -> bias in [-100, 100]")
    min_tokens: int = Field(0, ge=0, strict=True, description="no stop before this many")
    response_format: ResponseFormat | None = None

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

    def output_tokens(self) -> int:
        return self.max_tokens

    def logprobs_count(self) -> int | None:
        return None

    def structured_spec(self) -> dict[str, Any] | None:
        return self.response_format.structured() if self.response_format else None

    def sampling(self) -> dict[str, Any]:
        """The engine's SamplingParams fields (the options only when they are on)."""
        out: dict[str, Any] = {
            "max_tokens": self.output_tokens(),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop or [],
            "ignore_eos": self.ignore_eos,
        }
        for name, off in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                          ("repetition_penalty", 1.0), ("min_tokens", 0)):  # fmt: skip
            if getattr(self, name) != off:
                out[name] = getattr(self, name)
        if self.logit_bias:
            out["logit_bias"] = self.logit_bias
        if (logprobs := self.logprobs_count()) is not None:
            out["logprobs"] = logprobs
        if (structured := self.structured_spec()) is not None:
            out["structured"] = structured
        return out
