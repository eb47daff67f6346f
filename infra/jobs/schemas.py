"""Request bodies of the job API and the OpenAI-compatible routes (suffix: Create).

Request fields are strict where pydantic would coerce: no "8" for an int, no 1 for a bool,
no true for a number (a float field takes an int). Every string must be encodable as UTF-8:
JSON may carry a lone surrogate ("\\udfff") that no store or response can write.

The OpenAI bodies list every field of OpenAI's current requests: each is honoured, or
refused with a 400 naming it (``refused_field``); a field OpenAI does not have is refused as
unknown (``extra="forbid"``), so nothing a client asks for is silently dropped. Null
means "not given" there, as in OpenAI's API. Checks that join fields, or need the model,
are in infra/jobs/openai_request.py and infra/jobs/request_checks.py.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tide_fleet.infra.contract.structured import as_structured
from tide_fleet.infra.jobs.deadlines import TimingFields
from tide_fleet.infra.jobs.fields import (
    METADATA_DOC,
    METADATA_MAX_KEYS,
    PROMPT_SCHEMA,
    Metadata,
    Text,
    check_prompts,
    check_refused,
    prompt_list,
    refused_field,
    single_prompt,
)
from tide_fleet.infra.jobs.messages import ChatMessage, Tool, ToolChoice
from tide_fleet.infra.jobs.sampling_fields import SamplingFields
from tide_fleet.infra.wire.protocol import Priority


class WebhookSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: HttpUrl


def _structured_shape(v: object) -> dict[str, Any] | None:
    if v is None:
        return None
    try:
        return as_structured(v).to_dict()  # type: ignore[arg-type]
    except ValueError as e:
        raise PydanticCustomError("invalid_structured", "{e}", {"e": str(e)}) from None


class JobCreate(SamplingFields, TimingFields):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]},
    )
    prompt: Annotated[
        str | list[int] | None, BeforeValidator(single_prompt),
        WithJsonSchema({"anyOf": [*PROMPT_SCHEMA["anyOf"][::2], {"type": "null"}]}),
    ] = Field(None, description="a string, or a list of token ids")  # fmt: skip
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    logprobs: int | None = Field(
        None, ge=0, le=20, strict=True, description="each token's logprob and this many top"
    )
    structured: Annotated[dict[str, Any] | None, BeforeValidator(_structured_shape)] = Field(
        None, description="the engine's form: {json_schema}, {json_object: true}, {regex}, "
        "{choice}, {grammar}; or use response_format",
    )  # fmt: skip
    priority: Priority = Priority.INTERACTIVE
    webhook: WebhookSpec | None = None
    metadata: Metadata | None = Field(None, max_length=METADATA_MAX_KEYS, description=METADATA_DOC)
    model: Text | None = Field(
        None, description="a served model or LoRA adapter, by name (default: the fleet's)"
    )

    @field_validator("structured")
    @classmethod
    def _not_both(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if v is not None and info.data.get("response_format") is not None:
            raise PydanticCustomError("conflict", "give structured or response_format, not both")
        return v

    @model_validator(mode="after")
    def _one_input(self) -> JobCreate:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        return self

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def structured_spec(self) -> dict[str, Any] | None:
        return self.structured if self.structured is not None else super().structured_spec()


# -- OpenAI-compatible request bodies (the routes and the batch API's lines) ---------------


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = Field(None, strict=True)
    include_obfuscation: Any = refused_field("no obfuscation fields are added to chunks", False)

    @field_validator("include_obfuscation", mode="before")
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        return check_refused(cls.model_fields[info.field_name or ""], value)


KEEP_NULL = ("prompt", "messages")


def _nullable(schema: dict[str, Any]) -> None:
    """The schema says what the bodies take: null for every field but the input."""
    null = {"type": "null"}
    for name, prop in schema.get("properties", {}).items():
        takes_null = prop.get("type") == "null" or null in prop.get("anyOf", [])
        if name not in KEEP_NULL and not takes_null and None not in prop.get("enum", []):
            schema["properties"][name] = {"anyOf": [prop, null]}


class OpenAIFields(SamplingFields, TimingFields):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_nullable)
    model: Text | None = Field(None, description="a served model or LoRA adapter (or leave it out)")
    stream: bool = Field(False, strict=True)
    stream_options: StreamOptions | None = None
    user: Text | None = Field(None, max_length=256, description="recorded on the job")

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k in KEEP_NULL}
        return data

    @field_validator("*", mode="before")
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        return check_refused(cls.model_fields[info.field_name or ""], value)


class CompletionCreate(OpenAIFields):
    prompt: Annotated[
        str | list[str] | list[int] | list[list[int]],
        BeforeValidator(check_prompts),
        WithJsonSchema(PROMPT_SCHEMA),
    ] = Field(description="a string, strings, token ids, or lists of token ids; one job each")
    max_tokens: int = Field(16, ge=1, strict=True)
    best_of: int | None = Field(None, ge=1, strict=True, description="only equal to n")
    echo: bool = Field(False, strict=True, description="the prompt before each choice's text")
    logprobs: int | None = Field(None, ge=0, le=5, strict=True)
    suffix: Any = refused_field(
        "Tide does not fill in the middle: send the text before the gap as prompt"
    )

    def logprobs_count(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """One entry per job: a string or a list of token ids."""
        return prompt_list(self.prompt)


class ChatCompletionCreate(OpenAIFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int = Field(256, ge=1, strict=True)
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    logprobs: bool = Field(False, strict=True)
    top_logprobs: int | None = Field(None, ge=0, le=20, strict=True)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = Field(None, strict=True)
    metadata: Metadata | None = Field(None, max_length=METADATA_MAX_KEYS, description=METADATA_DOC)
    safety_identifier: Text | None = Field(None, max_length=128, description="recorded")
    prompt_cache_key: Text | None = Field(None, max_length=256, description="recorded; "
                                          "prefix caching is automatic")  # fmt: skip
    store: Any = refused_field("Tide keeps no stored completions for evals or distillation", False)
    audio: Any = refused_field("Tide generates text only")
    modalities: Any = refused_field("Tide generates text only", ["text"])
    prediction: Any = refused_field("predicted outputs are not implemented")
    web_search_options: Any = refused_field("Tide has no web search")
    functions: Any = refused_field("deprecated by OpenAI: send tools")
    function_call: Any = refused_field("deprecated by OpenAI: send tool_choice")
    reasoning_effort: Any = refused_field("the served model does not reason")
    verbosity: Any = refused_field("the served model has no verbosity control")
    service_tier: Any = refused_field("Tide has one service tier", "auto", "default")
    moderation: Any = refused_field("Tide runs no moderation")
    prompt_cache_retention: Any = refused_field(
        "the prefix cache lives in worker memory", "in_memory"
    )
    prompt_cache_options: Any = refused_field("prefix caching is automatic")

    def output_tokens(self) -> int:
        return self.max_completion_tokens or self.max_tokens

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
