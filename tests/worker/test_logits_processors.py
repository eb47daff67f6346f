"""Batched logits processors against independent references: transformers' processors and numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tide_fleet.worker.engine.logits_processors import (
    apply_logit_bias,
    apply_penalties,
    apply_token_bitmask,
    mask_tokens,
    raw_logprobs,
    top_logprobs,
)

transformers = pytest.importorskip("transformers")

V = 300


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_repetition_penalty_matches_transformers():
    logits = _logits(4)
    prompts = [_ids(20, 1), _ids(5, 2), _ids(50, 3), _ids(1, 4)]
    outputs = [_ids(7, 5), [], _ids(30, 6), _ids(2, 7)]
    penalties = [1.3, 0.7, 2.0, 1.1]
    expected = logits.clone()
    for i in range(4):
        proc = transformers.RepetitionPenaltyLogitsProcessor(penalty=penalties[i])
        ids = torch.tensor([prompts[i] + outputs[i]])
        expected[i] = proc(ids, logits[i : i + 1].clone())[0]
    got = logits.clone()
    apply_penalties(
        got, [0, 1, 2, 3], [torch.tensor(p) for p in prompts],
        [torch.tensor(o, dtype=torch.long) for o in outputs],
        presence=[0.0] * 4, frequency=[0.0] * 4, repetition=penalties,
    )  # fmt: skip
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_presence_and_frequency_follow_openai_formula():
    # mu[j] - c[j] * frequency - (c[j] > 0) * presence, over generated tokens only.
    logits = _logits(3, seed=1)
    outputs = [_ids(40, 8), _ids(3, 9), []]
    presence, frequency = [0.5, -1.0, 2.0], [0.3, 1.5, -2.0]
    ref = logits.numpy().copy()
    for i, out in enumerate(outputs):
        counts = np.bincount(np.array(out, dtype=np.int64), minlength=V).astype(np.float32)
        ref[i] -= counts * frequency[i] + (counts > 0) * presence[i]
    got = logits.clone()
    apply_penalties(
        got, [0, 1, 2], [torch.tensor(_ids(9, 10))] * 3,
        [torch.tensor(o, dtype=torch.long) for o in outputs],
        presence=presence, frequency=frequency, repetition=[1.0] * 3,
    )  # fmt: skip
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-6)


def test_processors_touch_only_their_rows():
    logits = _logits(5, seed=2)
    before = logits.clone()
    apply_penalties(
        logits, [1, 3], [torch.tensor([5, 6])] * 2, [torch.tensor([5, 7])] * 2,
        presence=[1.0, 1.0], frequency=[1.0, 1.0], repetition=[1.5, 1.5],
    )  # fmt: skip
    apply_logit_bias(logits, [3], [{9: 4.0}])
    mask_tokens(logits, [1], [[2]])
    apply_token_bitmask(logits, [3], torch.zeros(1, (V + 31) // 32, dtype=torch.int32))
    for row in (0, 2, 4):
        assert torch.equal(logits[row], before[row])
    assert not torch.equal(logits[1], before[1])


def test_logit_bias_is_added():
    logits = _logits(3, seed=3)
    ref = logits.numpy().copy()
    biases = [{0: 100.0, 299: -100.0}, {}, {17: 2.5, 18: -0.5}]
    for i, b in enumerate(biases):
        for t, v in b.items():
            ref[i, t] += v
    got = logits.clone()
    apply_logit_bias(got, [0, 1, 2], biases)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-6)


def test_mask_tokens_matches_min_new_tokens_processor():
    logits = _logits(2, seed=4)
    proc = transformers.MinNewTokensLengthLogitsProcessor(
        prompt_length_to_skip=3, min_new_tokens=5, eos_token_id=[2, 7]
    )
    expected = proc(torch.tensor([[1, 4, 5, 6]]), logits[:1].clone())[0]
    got = logits.clone()
    mask_tokens(got, [0], [[2, 7]])
    torch.testing.assert_close(got[0], expected, atol=0, rtol=0)
    assert torch.equal(got[1], logits[1])


def _reference_unpack(bitmask: np.ndarray, vocab: int) -> np.ndarray:
    bits = np.unpackbits(bitmask.view(np.uint8), bitorder="little").reshape(bitmask.shape[0], -1)
    return bits[:, :vocab].astype(bool)


def test_token_bitmask_matches_a_bit_by_bit_reference():
    rng = np.random.default_rng(0)
    words = (V + 31) // 32
    bitmask = rng.integers(-(2**31), 2**31, size=(3, words), dtype=np.int64).astype(np.int32)
    bitmask[1] = -1  # everything allowed
    allowed = _reference_unpack(bitmask, V)
    logits = _logits(4, seed=5)
    got = logits.clone()
    apply_token_bitmask(got, [0, 2, 3], torch.from_numpy(bitmask))
    expected = logits.numpy().copy()
    for j, row in enumerate([0, 2, 3]):
        expected[row][~allowed[j]] = -np.inf
    np.testing.assert_array_equal(got.numpy(), expected)
    every = logits[:3].clone()  # all rows constrained, in order: the in-place path
    apply_token_bitmask(every, [0, 1, 2], torch.from_numpy(bitmask))
    expected = logits[:3].numpy().copy()
    expected[~allowed] = -np.inf
    np.testing.assert_array_equal(every.numpy(), expected)


def test_logprobs_are_raw_log_softmax_and_top_k():
    logits = _logits(3, seed=6)
    lp = raw_logprobs(logits, [0, 2])
    ref = torch.log_softmax(logits[[0, 2]].double(), dim=-1).float()
    torch.testing.assert_close(lp, ref, atol=1e-5, rtol=1e-5)
    chosen, top = top_logprobs(lp, [int(logits[0].argmin()), 5], [3, 0])
    assert chosen[0] == pytest.approx(float(ref[0].min()), abs=1e-5)
    assert chosen[1] == pytest.approx(float(ref[1, 5]), abs=1e-5)
    best = ref[0].topk(3)
    assert list(top[0]) == best.indices.tolist()
    assert list(top[0].values()) == pytest.approx(best.values.tolist(), abs=1e-5)
    assert top[1] == {}
