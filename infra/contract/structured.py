"""Structured-output specs: what a request's output must match, and its validation.

Torch-free (llguidance is a self-contained Rust wheel), so the gateway can refuse a bad
schema with a 400 before anything is queued: ``validate(spec)`` raises ValueError naming
the problem. The engine compiles the same grammar text for its matchers
(``tide_fleet.worker.engine.grammar``), so what validates here is what runs there.

llguidance is needed only to compile: without it (an engine-only install, as for
``scripts/gpu_check.py``) specs still build and the engine still runs, and compiling a
spec raises ValueError naming the package (``require_llguidance``), so a structured
request is refused as a bad grammar would be.

JSON is generated compactly with Python's ``json.dumps`` separators (", " and ": ") and
no other whitespace: a model cannot stall in a run of newlines, and outputs are short.
Properties come in the schema's order. JSON Schema's defaults hold: without
``"additionalProperties": false`` an object may carry extra keys (OpenAI's strict mode
requires it false, and every property required; that policy is the gateway's to enforce).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

try:
    import llguidance
except ImportError:
    HAS_LLGUIDANCE = False
else:
    HAS_LLGUIDANCE = True

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")
MAX_ERROR_CHARS = 600
# A choice list compiles to one lexeme (a trie in llguidance's lexer), not one grammar
# alternative per option: 50,000 short options validate in about 0.4 s. The cap bounds
# that work at the gateway.
MAX_CHOICES = 10_000
NO_LLGUIDANCE = (
    "structured outputs need the llguidance package (pip install 'llguidance>=1.9,<2'), "
    "which is not installed here"
)


@dataclass(frozen=True)
class StructuredOutput:
    """One output constraint: exactly one field is set.

    json_object: true for any JSON object (OpenAI ``response_format: {"type": "json_object"}``).
    json_schema: a JSON Schema (OpenAI ``response_format.json_schema.schema``); a JSON
        string is accepted too. Honoured strictly, as OpenAI's ``strict: true``.
    regex: the whole output matches this regular expression (Rust ``regex`` syntax,
        anchored at both ends; ``\\d``, ``\\w`` are Unicode-aware, as in Python: write
        ``[0-9]`` for ASCII digits).
    choice: the output is exactly one of these strings.
    grammar: a context-free grammar in Lark syntax (llguidance's dialect), or GBNF.
    """

    json_object: bool = False
    json_schema: dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StructuredOutput:
        """Build from the wire form (what ``to_dict`` gives); raise ValueError on its shape."""
        if not isinstance(data, dict):
            raise ValueError(f"structured must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown structured field {unknown[0]!r}; use one of {KINDS}")
        schema = data.get("json_schema")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"json_schema is not valid JSON: {e}") from None
        return cls(
            json_object=data.get("json_object", False),
            json_schema=schema,
            regex=data.get("regex"),
            choice=data.get("choice"),
            grammar=data.get("grammar"),
        )

    def __post_init__(self) -> None:
        if self.json_object not in (True, False):
            raise ValueError(f"json_object must be true or false, got {self.json_object!r}")
        num_set = bool(self.json_object) + sum(
            getattr(self, k) is not None for k in KINDS if k != "json_object"
        )
        if num_set != 1:
            raise ValueError(f"structured: exactly one of {', '.join(KINDS)} must be set")
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise ValueError("json_schema must be a JSON object (a dict)")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string")
        if self.choice is not None and (
            not isinstance(self.choice, list)
            or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError("choice must be a non-empty list of strings (each non-empty)")
        if self.choice is not None and len(self.choice) > MAX_CHOICES:
            raise ValueError(
                f"choice has {len(self.choice)} options; at most {MAX_CHOICES} are allowed"
            )

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(k for k in KINDS[1:] if getattr(self, k) is not None)

    def to_dict(self) -> dict[str, Any]:
        """The wire form: only the field that is set."""
        return {self.kind: getattr(self, self.kind)}

    @cached_property
    def _key(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def cache_key(self) -> str:
        """Equal for equal constraints (dict order aside): compiled grammars are shared by it."""
        return self._key


def as_structured(spec: StructuredOutput | dict[str, Any]) -> StructuredOutput:
    return spec if isinstance(spec, StructuredOutput) else StructuredOutput.from_dict(spec)


def grammar_for(spec: StructuredOutput) -> str:
    """The llguidance grammar text for a spec (not yet checked: see ``validate``)."""
    require_llguidance()
    if spec.json_object or spec.json_schema is not None:
        schema = spec.json_schema if spec.json_schema is not None else {"type": "object"}
        return llguidance.LLMatcher.grammar_from_json_schema(
            schema, {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
        )
    if spec.regex is not None:
        return llguidance.LLMatcher.grammar_from_regex(spec.regex)
    if spec.choice is not None:
        return choice_grammar(spec.choice)
    assert spec.grammar is not None
    try:
        return llguidance.grammar_from("grammar", spec.grammar)
    except ValueError as e:
        raise ValueError(f"grammar: {e}") from None


def choice_grammar(choices: list[str]) -> str:
    """One terminal whose alternatives are the choices: the lexer matches them as a trie.
    (As one grammar rule with an alternative per option, an Earley row holds every option
    still alive, and llguidance stops a parse whose row passes 2,000 items.)"""
    literals = " | ".join(json.dumps(c) for c in choices)
    return llguidance.LLMatcher.grammar_from_lark(f"start: CHOICE\nCHOICE: {literals}")


def validate(spec: StructuredOutput | dict[str, Any]) -> None:
    """Raise ValueError, naming the field and the problem, unless the spec compiles.

    Checks the shape (exactly one kind) and compiles the grammar without a tokenizer:
    bad JSON Schema types, unsatisfiable bounds, missing ``$ref`` targets, bad regexes
    and patterns, undefined grammar rules. A couple of milliseconds for a realistic schema.
    """
    structured = as_structured(spec)
    check_grammar(structured.kind, grammar_for(structured))


def check_grammar(kind: str, grammar: str) -> None:
    require_llguidance()
    message = llguidance.LLMatcher.validate_grammar(grammar)
    if message:
        raise ValueError(f"{kind}: {trim_error(message)}")


def require_llguidance() -> None:
    """Raise ValueError naming the package where llguidance is not installed."""
    if not HAS_LLGUIDANCE:
        raise ValueError(NO_LLGUIDANCE)


def trim_error(message: str) -> str:
    """llguidance's message cut to MAX_ERROR_CHARS (its parse errors quote the grammar)."""
    message = message.strip()
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS] + " ..."
