"""A model's chat template (Jinja, from tokenizer_config.json), rendered as Hugging Face's
``apply_chat_template`` does: a sandboxed environment, ``raise_exception``, ``tojson``
without HTML escaping, ``strftime_now``; tools passed as ``tools``. Compiled once per
template text.

Whether a template supports tools is read by rendering it with a probe tool: a template
that never looks at ``tools`` cannot show the model what it may call.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tide_fleet.infra.contract.tokenizer import Tokenizer

PROBE_NAME = "tide_probe_function_7c1f"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": PROBE_NAME,
        "description": "A probe: does the template show tools?",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=16)
def compiled(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def _special(tok: Tokenizer, name: str) -> str:
    value = tok.config.get(name) or ""
    return str(value.get("content", "")) if isinstance(value, dict) else str(value)


def render(
    tok: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text; raises jinja2.TemplateError when the template refuses the input
    (and ValueError when the model has none)."""
    if not tok.chat_template:
        raise ValueError("no chat template")
    extra: dict[str, Any] = {"tools": tools} if tools else {}
    return compiled(tok.chat_template).render(
        messages=messages,
        add_generation_prompt=True,
        bos_token=_special(tok, "bos_token"),
        eos_token=_special(tok, "eos_token"),
        **extra,
    )


def supports_tools(tok: Tokenizer) -> bool:
    """True when the template shows the tools it is given to the model."""
    return bool(tok.chat_template) and _shows_tools(
        tok.chat_template, _special(tok, "bos_token"), _special(tok, "eos_token")
    )


@functools.lru_cache(maxsize=16)
def _shows_tools(template: str, bos: str, eos: str) -> bool:
    if "tools" not in template:
        return False
    try:
        text = compiled(template).render(
            messages=[{"role": "user", "content": "hi"}], tools=[PROBE_TOOL],
            add_generation_prompt=True, bos_token=bos, eos_token=eos,
        )  # fmt: skip
    except jinja2.TemplateError:
        return False
    return PROBE_NAME in text
