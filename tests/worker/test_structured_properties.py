"""Property: over many random JSON schemas, every completed sampled output validates.

A seeded generator builds schemas (objects with required and optional properties, arrays,
enums, consts, anyOf, nesting, string lengths and patterns, numbers with bounds); a
random-weight model samples at temperature 1 with a seed per request, so the outputs
wander all over what each schema allows. The reference is `jsonschema`, not the grammar
library.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from tests.conftest import make_engine
from tide_fleet.infra.contract.structured import validate
from tide_fleet.worker.engine import SamplingParams

jsonschema = pytest.importorskip("jsonschema")

NAMES = ["id", "name", "total", "items", "kind", "note", "qty", "date", "tags", "ok"]
PATTERNS = ["^[A-Z]{2}-[0-9]{3}$", "^(red|green|blue)$", "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", "^a+b?$"]


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object or array at the top (what extraction asks for); anything below it."""
    leaves = ["string", "pattern", "integer", "number", "boolean", "null", "enum", "const"]
    if depth == 0:
        kind = rng.choice(["object"] * 4 + ["array"])
    else:
        kind = rng.choice(leaves + (["object", "object", "array", "anyOf"] if depth < 3 else []))
    if kind == "string":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 6)}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind in ("integer", "number"):
        schema: dict[str, Any] = {"type": kind}
        lo = rng.randint(-1000, 1000)
        if rng.random() < 0.6:
            schema["exclusiveMinimum" if rng.random() < 0.3 else "minimum"] = lo
        if rng.random() < 0.6:
            schema["maximum"] = lo + rng.randint(2, 5000)
        return schema
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        pool = ["a", "b c", "ünï", 1, 2.5, True, None, "x" * 5]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 42, False])}
    if kind == "array":
        lo = rng.randint(0, 2)
        return {
            "type": "array",
            "items": random_schema(rng, depth + 1),
            "minItems": lo,
            "maxItems": lo + rng.randint(0, 2),
        }
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(2)]}
    names = rng.sample(NAMES, rng.randint(1, 4))
    return {
        "type": "object",
        "properties": {n: random_schema(rng, depth + 1) for n in names},
        "required": [n for n in names if rng.random() < 0.6],
        "additionalProperties": False,
    }


@pytest.mark.slow
def test_every_completed_output_validates_against_its_random_schema(tiny_path):
    rng = random.Random(2024)
    schemas = [random_schema(rng) for _ in range(200)]
    for schema in schemas:
        validate({"json_schema": schema})
    engine = make_engine(tiny_path, max_num_seqs=64)
    params = [
        SamplingParams(
            temperature=1.0, seed=1000 + i, max_tokens=400, structured={"json_schema": s}
        )
        for i, s in enumerate(schemas)
    ]
    outs = engine.generate([[1, 20 + i] for i in range(len(schemas))], params)
    completed = [(o, s) for o, s in zip(outs, schemas, strict=True) if o.finish_reason == "stop"]
    assert len(completed) >= 0.95 * len(schemas), [o.finish_reason for o in outs]
    for out, schema in completed:
        instance = json.loads(out.text)
        jsonschema.Draft202012Validator(schema).validate(instance)
    assert len({o.text for o, _ in completed}) > 0.6 * len(completed)  # sampling did vary
    engine.block_manager.assert_all_free()


def test_sampled_regexes_hold_over_many_seeds(tiny_path):
    engine = make_engine(tiny_path)
    # [0-9], not \d: both engines read \d as any Unicode digit, and the Rust regex crate
    # knows digits newer than this Python's Unicode tables.
    regex = r"(\+[0-9]{1,3} )?\([0-9]{3}\) [0-9]{3}-[0-9]{4}"
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=60, structured={"regex": regex})
        for s in range(20)
    ]
    for out in engine.generate([[1, 30]] * 20, params):
        assert out.finish_reason == "stop"
        assert re.fullmatch(regex, out.text), out.text
