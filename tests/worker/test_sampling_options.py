"""Penalties, logit bias, min_tokens and logprobs through the engine, held to references:
transformers' generate with the same processors, or a numpy recomputation from its logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.models.dummy import EOS_ID

transformers = pytest.importorskip("transformers")

PROMPT = [1, *range(40, 52)]


@pytest.fixture(scope="module")
def hf_model(tiny_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_path), dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def engine(tiny_path):
    return make_engine(tiny_path)


def _hf_generate(model, prompt: list[int], n: int, **kwargs) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, **kwargs)
    return out[0, len(prompt) :].tolist()


def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def test_repetition_penalty_matches_transformers_generate(engine, hf_model):
    for penalty in (1.8, 0.6):
        sp = SamplingParams(
            max_tokens=30, temperature=0.0, repetition_penalty=penalty, ignore_eos=True
        )
        got = engine.generate([PROMPT], sp)[0].token_ids
        ref = _hf_generate(hf_model, PROMPT, 30, repetition_penalty=penalty, eos_token_id=None)
        assert got == ref, penalty
    plain = engine.generate([PROMPT], SamplingParams(max_tokens=30, temperature=0.0))[0]
    assert plain.token_ids != got  # the penalty did change the path


def test_min_tokens_and_logit_bias_match_transformers_generate(engine, hf_model):
    # +30 on EOS makes it the argmax everywhere; min_tokens holds it off for 6 tokens.
    sp = SamplingParams(max_tokens=20, temperature=0.0, min_tokens=6, logit_bias={EOS_ID: 30})
    out = engine.generate([PROMPT], sp)[0]
    ref = _hf_generate(
        hf_model, PROMPT, 20, min_new_tokens=6, sequence_bias=[[[EOS_ID], 30.0]],
        eos_token_id=EOS_ID, pad_token_id=0,
    )  # fmt: skip
    assert out.token_ids == ref
    assert len(out.token_ids) == 7 and out.token_ids[-1] == EOS_ID
    assert out.finish_reason == "stop"


def test_min_tokens_holds_back_stop_strings(tiny_path):
    engine = make_engine(tiny_path)
    # Force the same byte ("a" = 4 + 97) forever; "a" is also the stop string.
    sp = dict(max_tokens=10, temperature=0.0, logit_bias={101: 100}, stop=["a"])
    early = engine.generate([PROMPT], SamplingParams(**sp))[0]
    assert early.finish_reason == "stop" and early.token_ids == [101] and early.text == ""
    late = engine.generate([PROMPT], SamplingParams(**sp, min_tokens=4))[0]
    assert late.finish_reason == "stop" and late.token_ids == [101] * 5
    assert late.text == "aaaa"


def test_presence_and_frequency_penalties_match_a_numpy_recomputation(engine, hf_model):
    presence, frequency, n = 0.8, 0.6, 24
    sp = SamplingParams(
        max_tokens=n, temperature=0.0, presence_penalty=presence,
        frequency_penalty=frequency, ignore_eos=True,
    )  # fmt: skip
    got = engine.generate([PROMPT], sp)[0].token_ids
    generated: list[int] = []
    for _ in range(n):
        logits = _hf_logits(hf_model, PROMPT + generated)[-1].numpy().astype(np.float64)
        counts = np.bincount(np.array(generated, dtype=np.int64), minlength=logits.shape[0])
        logits -= counts * frequency + (counts > 0) * presence
        generated.append(int(logits.argmax()))
    assert got == generated
    plain = engine.generate([PROMPT], SamplingParams(max_tokens=n, temperature=0.0))[0]
    assert plain.token_ids != got


def test_logprobs_are_the_raw_model_distribution(engine, hf_model):
    # Penalties and bias change the choice but not the reported (raw) logprobs.
    sp = SamplingParams(
        max_tokens=12, temperature=1.0, seed=7, logprobs=5, repetition_penalty=1.4,
        logit_bias={60: 3.0}, ignore_eos=True,
    )  # fmt: skip
    engine.add_request("lp", PROMPT, sp)
    steps, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            assert len(out.new_logprobs) == len(out.new_token_ids)
            steps.extend(out.new_logprobs)
            final = out if out.finished else final
    assert final is not None and final.logprobs == steps and len(steps) == 12
    ref = torch.log_softmax(_hf_logits(hf_model, PROMPT + final.token_ids).double(), dim=-1)
    for i, (token, lp) in enumerate(zip(final.token_ids, final.logprobs, strict=True)):
        row = ref[len(PROMPT) - 1 + i]
        assert lp.token_id == token
        assert lp.logprob == pytest.approx(float(row[token]), abs=1e-4)
        best = row.topk(5)
        assert list(lp.top_logprobs) == best.indices.tolist()
        assert list(lp.top_logprobs.values()) == pytest.approx(best.values.tolist(), abs=1e-4)


def test_logprobs_zero_gives_only_the_chosen_token(engine):
    out = engine.generate([PROMPT], SamplingParams(max_tokens=3, temperature=0.0, logprobs=0))[0]
    assert [lp.top_logprobs for lp in out.logprobs] == [{}, {}, {}]
    assert all(lp.logprob <= 0.0 for lp in out.logprobs)
    none = engine.generate([PROMPT], SamplingParams(max_tokens=3, temperature=0.0))[0]
    assert none.logprobs is None and none.token_ids == out.token_ids


def test_seeded_penalised_sampling_is_batch_independent(engine):
    sp = SamplingParams(
        max_tokens=20, temperature=1.0, seed=11, presence_penalty=1.0, frequency_penalty=0.5,
        repetition_penalty=1.2, logit_bias={70: 2.0, 71: -5.0}, min_tokens=3,
    )  # fmt: skip
    alone = engine.generate([PROMPT], sp)[0].token_ids
    others = [
        SamplingParams(max_tokens=25, temperature=0.0),
        SamplingParams(max_tokens=15, temperature=1.0, presence_penalty=-1.0),
        SamplingParams(max_tokens=9, temperature=0.7, logprobs=2),
    ]
    outs = engine.generate(
        [[1, 80], [1, 81, 82], PROMPT, [1, 90]], [others[0], others[1], sp, others[2]]
    )
    assert outs[2].token_ids == alone
    engine.block_manager.assert_all_free()
