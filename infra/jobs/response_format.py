"""`response_format`: OpenAI's text / json_object / json_schema forms and Tide's regex,
choice and grammar forms, as the engine's structured-output spec (its wire dict).

`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` constrains the
output to the schema whatever `strict` says (constrained decoding is always strict);
without a `schema` it is any JSON object. `{"type": "regex", "regex": "..."}`,
`{"type": "choice", "choice": [...]}` and `{"type": "grammar", "grammar": "..."}` (Lark or
GBNF, llguidance's dialect) follow vLLM's structured outputs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from tide_fleet.infra.jobs.fields import NonEmptyText, Text
from tide_fleet.infra.jobs.messages import NAME_PATTERN

KIND_FIELDS = {"json_schema": "json_schema", "regex": "regex", "choice": "choice",
               "grammar": "grammar"}  # fmt: skip


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=NAME_PATTERN)
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, strict=True)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema", "regex", "choice", "grammar"]
    json_schema: JsonSchemaFormat | None = None
    regex: NonEmptyText | None = None
    choice: list[NonEmptyText] | None = Field(None, min_length=1)
    grammar: NonEmptyText | None = None

    @model_validator(mode="after")
    def _one_form(self) -> ResponseFormat:
        wanted = KIND_FIELDS.get(self.type)
        for name in KIND_FIELDS.values():
            given = getattr(self, name) is not None
            if name == wanted and not given:
                raise PydanticCustomError(
                    "missing_field", "type {kind} needs its {kind} field", {"kind": repr(self.type)}
                )
            if name != wanted and given:
                raise PydanticCustomError(
                    "unexpected_field", "{name} does not go with type {kind}",
                    {"name": repr(name), "kind": repr(self.type)},
                )  # fmt: skip
        return self

    def structured(self) -> dict[str, Any] | None:
        """The engine's structured-output spec (wire form), or None for plain text."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"json_object": True}
        if self.json_schema is not None:
            schema = self.json_schema.schema_
            return {"json_object": True} if schema is None else {"json_schema": schema}
        return {self.type: getattr(self, self.type)}
