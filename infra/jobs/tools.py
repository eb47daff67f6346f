"""Tool calls: the constraint that makes an output a call, and reading calls out of text.

`tool_choice` "required" or a named function constrains the output (structured
json_schema) to one call ``{"name": <a function>, "arguments": <its parameters>}``;
"auto" leaves it free, and an output that reads as calls becomes ``tool_calls``: the
whole text one call object, a list of them (``parallel_tool_calls`` not false), or calls
wrapped in ``<tool_call>...</tool_call>`` (Hermes/Qwen), with ``parameters`` taken for
``arguments`` (Llama 3.1); "none" reads nothing. The record's ``render.tools`` holds the
mode and the function names, so batch output renders as the route does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tide_fleet.infra.jobs.messages import NamedToolChoice, Tool

WRAPPED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
OPENERS = ("{", "[", "<tool_call>")


def call_schema(tool: Tool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.function.name},
            "arguments": tool.function.parameters_schema(),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def constraint(tools: list[Tool], choice: str | NamedToolChoice) -> dict[str, Any] | None:
    """The structured spec (wire form) a tool_choice asks for; None when unconstrained."""
    if isinstance(choice, NamedToolChoice):
        chosen = [t for t in tools if t.function.name == choice.function.name]
        return {"json_schema": call_schema(chosen[0])}
    if choice == "required":
        schemas = [call_schema(t) for t in tools]
        return {"json_schema": schemas[0] if len(schemas) == 1 else {"anyOf": schemas}}
    return None


def _call(obj: object, names: set[str]) -> dict[str, Any] | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict) or set(obj) - {"name", "arguments", "parameters", "type"}:
        return None
    return {"name": obj["name"], "arguments": args}


def parse_calls(text: str, names: set[str], parallel: bool = True) -> list[dict[str, Any]] | None:
    """The calls the text is made of ({name, arguments: dict}), or None if it is not calls."""
    stripped = text.strip()
    try:
        if stripped.startswith("<tool_call>"):
            if WRAPPED.sub("", stripped).strip():
                return None  # text beside the calls: a message, not calls
            objs = [json.loads(body) for body in WRAPPED.findall(stripped)]
        else:
            parsed = json.loads(stripped)
            objs = parsed if isinstance(parsed, list) else [parsed]
    except json.JSONDecodeError:
        return None
    calls = [_call(o, names) for o in objs]
    if not calls or any(c is None for c in calls) or (len(calls) > 1 and not parallel):
        return None
    return calls  # type: ignore[return-value]


def tool_calls(calls: list[dict[str, Any]], call_id: str) -> list[dict[str, Any]]:
    """OpenAI's message.tool_calls (arguments as a JSON string); ids `call_id`_k."""
    return [
        {"id": f"{call_id}_{k}", "type": "function",
         "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
        for k, c in enumerate(calls)
    ]  # fmt: skip


@dataclass
class ToolRender:
    """What the renderer needs (stored in the job record as ``render.tools``)."""

    mode: str  # "auto" (read calls if the text is calls) or "required" (constrained)
    names: list[str]
    parallel: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "names": self.names, "parallel": self.parallel}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolRender:
        return cls(data["mode"], list(data["names"]), bool(data.get("parallel", True)))

    def message(self, text: str, finish: str | None, call_id: str) -> tuple[dict[str, Any], Any]:
        """(the assistant message, finish_reason) of a choice's text."""
        calls = parse_calls(text, set(self.names), self.parallel)
        if calls is None:
            return {"role": "assistant", "content": text}, finish
        return {"role": "assistant", "content": None,
                "tool_calls": tool_calls(calls, call_id)}, "tool_calls"  # fmt: skip


@dataclass
class ToolStream:
    """A streamed choice that may turn out to be calls: text is held back while it could
    still be a call (only whitespace, or it starts like one), passed on once it cannot."""

    render: ToolRender
    held: str = ""
    passing: bool = False
    logprobs: list[Any] = field(default_factory=list)

    def feed(self, text: str, logprobs: list[Any] | None) -> tuple[str, list[Any] | None]:
        """(text to send now, its logprobs); text held back comes later."""
        if self.passing:
            return text, logprobs
        self.held += text
        self.logprobs += logprobs or []
        head = self.held.lstrip()
        maybe_call = self.render.mode == "required" or not head or any(
            head.startswith(o) or o.startswith(head) for o in OPENERS
        )  # fmt: skip
        if maybe_call:
            return "", None
        self.passing = True
        out, lps = self.held, self.logprobs
        self.held, self.logprobs = "", []
        return out, lps or None
