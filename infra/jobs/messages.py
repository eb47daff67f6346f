"""Chat messages and tools as requests carry them (OpenAI's shapes, text only).

A message's content is a string, or a list of text parts (joined with newlines); image,
audio and file parts are refused naming the message. An assistant message may carry
`tool_calls` (then its content may be null), a tool message its `tool_call_id`.
`developer` is rendered as `system` (chat templates know no developer role).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tide_fleet.infra.jobs.fields import NonEmptyText, Text, encodable

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule for function and schema names
CONTENT_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {
            "type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        }},
        {"type": "null"},
    ]
}  # fmt: skip


def _text_content(value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("invalid_content", "must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
            raise PydanticCustomError(
                "unsupported_content", "part {j} is not a text part (type {kind}): Tide serves "
                "text models, so content parts must be of type 'text'",
                {"j": j, "kind": repr(kind)},
            )  # fmt: skip
        texts.append(part["text"])
    return "\n".join(texts)


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: NonEmptyText
    arguments: Text  # a JSON string, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | None = Field(None, json_schema_extra=CONTENT_SCHEMA)
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: Text | None = None
    refusal: None = None  # an assistant's earlier refusal: none to replay here

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: object) -> object:
        text = _text_content(v)
        return encodable(text) if text is not None else None

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError(
                "missing_content", "content may be null only in an assistant message with "
                "tool_calls",
            )  # fmt: skip
        if self.tool_calls is not None and self.role != "assistant":
            raise PydanticCustomError("invalid_message", "only assistant messages have tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise PydanticCustomError("invalid_message", "a tool message needs its tool_call_id")
        return self

    def for_template(self) -> dict[str, Any]:
        """The dict a chat template reads: tool-call arguments as objects (what templates
        index into, as vLLM hands them), only the keys that are set."""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": self.content,
        }
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": _arguments(c.function)}}
                for c in self.tool_calls
            ]  # fmt: skip
        return out


def _arguments(call: FunctionCall) -> Any:
    try:
        parsed = json.loads(call.arguments)
    except json.JSONDecodeError:
        return call.arguments
    return parsed if isinstance(parsed, dict) else call.arguments


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    description: Text | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(None, strict=True)

    def parameters_schema(self) -> dict[str, Any]:
        """Omitted parameters mean a function that takes none (OpenAI)."""
        if self.parameters is None:
            return {"type": "object", "properties": {}, "additionalProperties": False}
        return self.parameters


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


def _tool_choice(value: object) -> object:
    """One clear error for a tool_choice of another shape (OpenAI's allowed_tools and custom
    tools included), instead of one per member of the union."""
    if value in ("none", "auto", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        return value  # the model checks its function.name
    raise PydanticCustomError(
        "unsupported_value", "must be 'none', 'auto', 'required' or a named function "
        "(type 'function' with function.name), got {value}", {"value": repr(value)[:80]},
    )  # fmt: skip


ToolChoice = Annotated[
    Literal["none", "auto", "required"] | NamedToolChoice, BeforeValidator(_tool_choice)
]
