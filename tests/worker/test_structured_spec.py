"""Structured-output specs: their shape, and the torch-free validation the gateway calls."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.infra.contract.structured import StructuredOutput, grammar_for, validate


def test_validation_imports_no_torch():
    code = (
        "import sys\n"
        "from tide_fleet.infra.contract.structured import validate\n"
        "from tide_fleet.infra.contract.sampling_params import SamplingParams\n"
        "validate({'json_schema': {'type': 'object'}})\n"
        "SamplingParams(presence_penalty=1.0, structured={'regex': 'a+'})\n"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


@pytest.mark.parametrize(
    "spec",
    [
        {"json_object": True},
        {"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        {"json_schema": '{"type": "array", "items": {"type": "string"}}'},
        {"regex": r"[A-Z]{3}-\d{4}"},
        {"choice": ["positive", "negative", "neutral"]},
        {"grammar": 'start: "yes" | "no"'},
    ],
)
def test_valid_specs_pass(spec):
    validate(spec)
    validate(StructuredOutput.from_dict(spec))
    assert grammar_for(StructuredOutput.from_dict(spec))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "exactly one of json_object, json_schema, regex, choice, grammar"),
        ({"regex": "a", "choice": ["a"]}, "exactly one of"),
        ({"json_object": False}, "exactly one of"),
        ({"schema": {}}, "unknown structured field 'schema'"),
        ({"json_schema": ["not", "a", "dict"]}, "json_schema must be a JSON object"),
        ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
        ({"json_schema": {"type": "objekt"}}, "json_schema: .*Invalid type: objekt"),
        (
            {"json_schema": {"type": "integer", "minimum": 5, "maximum": 1}},
            r"json_schema: .*minimum \(5\) is greater than maximum \(1\)",
        ),
        ({"json_schema": {"$ref": "#/$defs/missing"}}, "json_schema: .*does not exist"),
        ({"json_schema": {"type": "string", "pattern": "(("}}, "(?s)json_schema: .*unclosed group"),
        ({"regex": "[a-"}, "(?s)regex: .*unclosed character class"),
        # Keywords the library cannot enforce are refused, never silently ignored.
        (
            {"json_schema": {"type": "array", "uniqueItems": True}},
            r'json_schema: Unimplemented keys: \["uniqueItems"\]',
        ),
        ({"json_schema": {"type": "string", "format": "banana"}}, "Unknown format: banana"),
        ({"regex": ""}, "regex must be a non-empty string"),
        ({"choice": []}, "choice must be a non-empty list of strings"),
        ({"choice": ["a", 3]}, "choice must be a non-empty list of strings"),
        ({"choice": ["x"] * 10_001}, "choice has 10001 options; at most 10000 are allowed"),
        ({"grammar": "start: foo"}, 'grammar: .*unknown name: "foo"'),
        ({"json_object": "yes"}, "json_object must be true"),
    ],
)
def test_bad_specs_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        validate(spec)


def test_sampling_params_take_the_spec_as_a_dict_and_round_trip():
    sp = SamplingParams(structured={"choice": ["a", "b"]})
    assert sp.structured == StructuredOutput(choice=["a", "b"])
    again = SamplingParams(structured=sp.structured.to_dict())
    assert again.structured == sp.structured
    with pytest.raises(ValueError, match="structured: exactly one of"):
        SamplingParams(structured={})


def test_cache_key_ignores_dict_order():
    a = StructuredOutput(json_schema={"type": "object", "required": ["x"]})
    b = StructuredOutput(json_schema={"required": ["x"], "type": "object"})
    assert a.cache_key() == b.cache_key()
    assert a.cache_key() != StructuredOutput(regex="x").cache_key()
