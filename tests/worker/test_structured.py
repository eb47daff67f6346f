"""Structured outputs through the engine: regex, choice, JSON; EOS and finishing; preemption."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import make_engine
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.models.dummy import EOS_ID

jsonschema = pytest.importorskip("jsonschema")

PROMPT = [1, *range(40, 50)]
EMAIL = r"[a-z]{2,8}@[a-z]{2,6}\.(com|org)"


@pytest.fixture(scope="module")
def engine(tiny_path):
    return make_engine(tiny_path)


def _sampled(n: int, **kwargs) -> list[SamplingParams]:
    return [SamplingParams(temperature=1.0, seed=s, **kwargs) for s in range(n)]


def test_regex_outputs_match(engine):
    outs = engine.generate([PROMPT] * 12, _sampled(12, max_tokens=40, structured={"regex": EMAIL}))
    for out in outs:
        assert out.finish_reason == "stop", out
        assert re.fullmatch(EMAIL, out.text), out.text
    assert len({o.text for o in outs}) > 6  # seeds vary the output
    engine.block_manager.assert_all_free()


def test_choice_outputs_are_one_of_the_choices(engine):
    choices = ["yes", "yesterday", "no", "maybe not"]
    outs = engine.generate(
        [PROMPT] * 16, _sampled(16, max_tokens=20, structured={"choice": choices})
    )
    assert {o.text for o in outs} <= set(choices)
    assert len({o.text for o in outs}) > 1


def test_thousands_of_overlapping_choices_decode(engine):
    # Options sharing prefixes ("1", "10", "100", ...) keep thousands of alternatives alive
    # at once; as one Earley rule that passed llguidance's 2,000 items per row mid-output.
    choices = [str(i) for i in range(5000)]
    outs = engine.generate([PROMPT] * 8, _sampled(8, max_tokens=8, structured={"choice": choices}))
    for out in outs:
        assert out.finish_reason == "stop" and out.text in choices, out


def test_a_complete_grammar_finishes_the_request_without_eos(engine):
    out = engine.generate([PROMPT], SamplingParams(temperature=0.0, structured={"choice": ["no"]}))[
        0
    ]
    assert out.text == "no" and out.finish_reason == "stop" and EOS_ID not in out.token_ids


def test_eos_is_allowed_only_where_the_grammar_may_end(engine):
    wants_eos = {EOS_ID: 100.0}
    fixed = SamplingParams(temperature=0.0, logit_bias=wants_eos, structured={"regex": "[a-z]{5}"})
    out = engine.generate([PROMPT], fixed)[0]
    assert re.fullmatch("[a-z]{5}", out.text) and out.finish_reason == "stop"
    assert EOS_ID not in out.token_ids
    open_ended = SamplingParams(
        temperature=0.0, logit_bias=wants_eos, max_tokens=30, structured={"regex": "[a-z]{3,}"}
    )
    out = engine.generate([PROMPT], open_ended)[0]
    assert out.token_ids[-1] == EOS_ID and len(out.token_ids) == 4
    assert re.fullmatch("[a-z]{3}", out.text) and out.finish_reason == "stop"


def test_min_tokens_does_not_outlast_a_complete_grammar(engine):
    sp = SamplingParams(temperature=0.0, min_tokens=10, structured={"choice": ["no"]})
    out = engine.generate([PROMPT], sp)[0]
    assert out.text == "no" and out.finish_reason == "stop"


def test_max_tokens_cuts_structured_output_short(engine):
    sp = SamplingParams(temperature=0.0, max_tokens=3, structured={"json_object": True})
    out = engine.generate([PROMPT], sp)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert out.text.startswith("{")


def test_stop_strings_still_apply(engine):
    sp = SamplingParams(temperature=0.0, stop=["@"], structured={"regex": EMAIL})
    out = engine.generate([PROMPT], sp)[0]
    assert out.finish_reason == "stop" and re.fullmatch("[a-z]{2,8}", out.text)


def test_json_schema_output_validates(engine):
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
            "currency": {"enum": ["USD", "EUR"]},
            "total": {"type": "integer", "minimum": 0, "maximum": 9999},
            "paid": {"type": "boolean"},
        },
        "required": ["id", "currency", "total", "paid"],
        "additionalProperties": False,
    }
    outs = engine.generate(
        [PROMPT] * 8, _sampled(8, max_tokens=80, structured={"json_schema": schema})
    )
    for out in outs:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), schema)


def test_one_schema_compiles_once_for_many_requests(tiny_path):
    engine = make_engine(tiny_path)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    same = [{"json_schema": dict(reversed(schema.items()))}, {"json_schema": schema}] * 4
    engine.generate([PROMPT] * 8, [SamplingParams(max_tokens=30, structured=s) for s in same])
    assert engine.grammar.num_compiles == 1


def test_constrained_rows_leave_unconstrained_ones_alone(engine):
    greedy = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    alone = engine.generate([[1, 70, 71]], greedy)[0].token_ids
    mixed = engine.generate(
        [PROMPT, [1, 70, 71], PROMPT],
        [
            SamplingParams(max_tokens=30, temperature=0.0, structured={"regex": EMAIL}),
            greedy,
            SamplingParams(
                max_tokens=30, temperature=1.0, seed=3, structured={"json_object": True}
            ),
        ],
    )
    assert mixed[1].token_ids == alone


def test_preemption_neither_refeeds_nor_skips_the_matcher(tiny_path):
    schema = {
        "type": "array",
        "items": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "minItems": 3,
        "maxItems": 5,
    }
    params = _sampled(10, max_tokens=60, structured={"json_schema": schema})
    prompts = [[1, *range(10 + i, 40 + 5 * i)] for i in range(10)]
    roomy = make_engine(tiny_path).generate(prompts, params)
    tight = make_engine(tiny_path, num_kv_blocks=14, max_num_batched_tokens=32, max_num_seqs=8)
    outs = tight.generate(prompts, params)
    assert tight.stats()["num_preemptions"] > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy]
    for out in outs:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), schema)
    tight.block_manager.assert_all_free()
    assert not tight.grammar.num_matchers


def test_a_bad_schema_is_refused_at_add_request(engine):
    bad = SamplingParams(
        structured={"json_schema": {"type": "integer", "minimum": 3, "maximum": 1}}
    )
    with pytest.raises(ValueError, match=r"json_schema: .*minimum \(3\) is greater than maximum"):
        engine.add_request("bad", PROMPT, bad)
    assert not engine.has_unfinished()


def test_abort_drops_the_matcher(engine):
    engine.add_request("a", PROMPT, SamplingParams(max_tokens=50, structured={"json_object": True}))
    engine.step()
    assert engine.grammar.num_matchers == 1
    engine.abort("a")
    engine.step()
    assert engine.grammar.num_matchers == 0 and not engine.has_unfinished()


def test_stories260k_sentencepiece_json(stories_path):
    engine = make_engine(stories_path)
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "mood": {"enum": ["happy", "sad", "scared"]},
            "age": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["name", "mood", "age"],
        "additionalProperties": False,
    }
    prompt = engine.tokenizer.encode("Once upon a time, there was a little girl named Lily.")
    params = [SamplingParams(temperature=0.0, max_tokens=80, structured={"json_schema": schema})]
    params += _sampled(6, max_tokens=80, structured={"json_schema": schema})
    for out in engine.generate([prompt] * 7, params):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
