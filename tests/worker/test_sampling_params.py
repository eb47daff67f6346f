"""The OpenAI-named sampling options: ranges, normalisation, and the engine's vocabulary checks."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.conftest import make_engine
from tide_fleet.infra.contract.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\], got 2.5"),
        ({"presence_penalty": "x"}, "presence_penalty must be a number"),
        ({"frequency_penalty": -2.01}, r"frequency_penalty must be in \[-2, 2\], got -2.01"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0, got 0.0"),
        ({"repetition_penalty": float("nan")}, "repetition_penalty must be a finite number > 0"),
        ({"logit_bias": {"5": 101}}, r"logit_bias values must be in \[-100, 100\], got 101"),
        ({"logit_bias": {"a": 1}}, "logit_bias keys must be token ids"),
        ({"logit_bias": {-1: 1}}, "logit_bias keys must be token ids"),
        ({"logit_bias": [1, 2]}, "logit_bias must be a mapping"),
        ({"min_tokens": -1}, "min_tokens must be at least 0, got -1"),
        ({"min_tokens": 20, "max_tokens": 10}, r"min_tokens \(20\) must not exceed max_tokens"),
        ({"logprobs": 21}, r"logprobs must be in \[0, 20\], got 21"),
        ({"logprobs": True}, "logprobs must be an integer"),
    ],
)
def test_option_errors_name_the_field_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_defaults_change_nothing():
    sp = SamplingParams()
    assert (sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty) == (0.0, 0.0, 1.0)
    assert sp.logit_bias is None and sp.min_tokens == 0 and sp.logprobs is None
    assert sp.structured is None and not sp.needs_logits_processing


def test_logit_bias_keys_from_json_become_ints():
    # OpenAI clients send JSON, whose object keys are strings.
    sp = SamplingParams(**json.loads('{"logit_bias": {"50": -100, "7": 2.5}}'))
    assert sp.logit_bias == {50: -100.0, 7: 2.5}
    assert sp.needs_logits_processing


def test_engine_rejects_token_ids_outside_the_vocabulary(tiny_path):
    engine = make_engine(tiny_path)
    with pytest.raises(ValueError, match=r"logit_bias token id 999 is outside the vocabulary"):
        engine.add_request("b", [1, 5], SamplingParams(logit_bias={999: 1.0}))
    assert not engine.has_unfinished()


def test_structured_needs_a_tokenizer(tiny_path):
    from tide_fleet.worker.engine import LLMEngine
    from tide_fleet.worker.models.loader import load_model

    engine = LLMEngine(load_model(tiny_path, "float32", "cpu"), None)
    with pytest.raises(ValueError, match="structured output needs the model's tokenizer"):
        engine.add_request("s", [1, 5], SamplingParams(structured={"regex": "a+"}))


def test_params_survive_the_json_round_trip_the_worker_uses():
    # The gateway stores the params as JSON; the worker builds SamplingParams(**json.loads(...)).
    sp = SamplingParams(
        max_tokens=50, presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.1,
        logit_bias={50: -100.0, 7: 2.5}, min_tokens=3, logprobs=5, seed=1,
        structured={"json_schema": {"type": "object", "required": ["a"]}},
    )  # fmt: skip
    again = SamplingParams(**json.loads(json.dumps(dataclasses.asdict(sp))))
    assert again == sp
    compact = {**dataclasses.asdict(sp), "structured": sp.structured.to_dict()}
    assert SamplingParams(**json.loads(json.dumps(compact))) == sp
