"""Reading tool calls out of text, and the constraint for required / named calls."""

from __future__ import annotations

import pytest

from tide_fleet.infra.jobs.messages import NamedFunction, NamedToolChoice, Tool
from tide_fleet.infra.jobs.tools import ToolRender, ToolStream, constraint, parse_calls

NAMES = {"f", "g"}


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ('{"name": "f", "arguments": {"a": 1}}', [{"name": "f", "arguments": {"a": 1}}]),
        ('  {"name": "f", "arguments": "{\\"a\\": 1}"}\n', [{"name": "f", "arguments": {"a": 1}}]),
        ('{"name": "g", "parameters": {}}', [{"name": "g", "arguments": {}}]),
        ('<tool_call>{"name": "f", "arguments": {}}</tool_call>\n'
         '<tool_call>{"name": "g", "arguments": {}}</tool_call>',
         [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]),
        ('{"name": "h", "arguments": {}}', None),  # not one of the tools
        ('{"name": "f", "arguments": [1]}', None),
        ('{"name": "f", "arguments": {}, "extra": 1}', None),
        ('Sure: {"name": "f", "arguments": {}}', None),
        ('<tool_call>{"name": "f", "arguments": {}}</tool_call> and more', None),
        ("[]", None),
        ("not json", None),
    ],
)  # fmt: skip
def test_parse_calls(text, calls):
    assert parse_calls(text, NAMES) == calls


def test_no_parallel_calls_when_asked_not_to():
    text = '[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]'
    assert parse_calls(text, NAMES, parallel=False) is None
    assert len(parse_calls(text, NAMES) or []) == 2


def tool(name: str) -> Tool:
    return Tool.model_validate({"type": "function", "function": {"name": name}})


def test_constraint_by_tool_choice():
    tools = [tool("f"), tool("g")]
    assert constraint(tools, "auto") is None and constraint(tools, "none") is None
    required = constraint(tools, "required")["json_schema"]  # type: ignore[index]
    assert [s["properties"]["name"]["const"] for s in required["anyOf"]] == ["f", "g"]
    named = NamedToolChoice(type="function", function=NamedFunction(name="g"))
    assert constraint(tools, named)["json_schema"]["properties"]["name"] == {"const": "g"}  # type: ignore[index]
    single = constraint([tool("f")], "required")["json_schema"]  # type: ignore[index]
    assert single["required"] == ["name", "arguments"]


def test_a_stream_holds_text_only_while_it_may_be_a_call():
    auto = ToolStream(ToolRender("auto", ["f"]))
    assert auto.feed("  ", None) == ("", None)
    assert auto.feed("<tool", None) == ("", None)  # a prefix of <tool_call>
    assert auto.feed("s are", None) == ("  <tools are", None) and auto.passing
    assert auto.feed(" fun", None) == (" fun", None)
    required = ToolStream(ToolRender("required", ["f"]))
    assert required.feed("hello", [{"t": 1}]) == ("", None) and required.logprobs == [{"t": 1}]
