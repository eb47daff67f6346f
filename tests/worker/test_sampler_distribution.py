"""The batched sampler draws from softmax(logits / T) (chi-square over many draws, fixed
seeds), seeded rows do not depend on the batch, and a step makes one read back."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.kernels.sampling import row_uniform
from tide_fleet.worker.engine.request import Request
from tide_fleet.worker.engine.sampler import NoTokenToSample, Sampler, profile_sampling

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
DRAWS = 20_000
# chi-square critical values at p = 0.001: a correct sampler fails one seed in a thousand,
# and these seeds are fixed.
CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 7: 24.32}


def chi_square(tokens: list[int], expected: torch.Tensor) -> tuple[float, int]:
    counts = torch.bincount(torch.tensor(tokens), minlength=len(expected)).double()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "drew a token of probability 0"
    exp = expected[keep].double() * len(tokens)
    return float(((counts[keep] - exp) ** 2 / exp).sum()), int(keep.sum()) - 1


class Produced(Request):
    """A request that has produced ``count`` tokens (what a seeded draw is keyed on)."""

    def __init__(self, request_id: str, params: SamplingParams, count: int) -> None:
        super().__init__(request_id, [1], params)
        self.count = count

    @property
    def num_output_tokens(self) -> int:
        return self.count


def requests(params: list[SamplingParams], produced: list[int] | None = None) -> list[Request]:
    counts = produced or [0] * len(params)
    return [Produced(f"r{i}", p, counts[i]) for i, p in enumerate(params)]


def draw(sampler: Sampler, reqs: list[Request], logits: torch.Tensor = LOGITS) -> list:
    return sampler.sample(logits.expand(len(reqs), -1).clone(), reqs).token_ids


def test_unseeded_rows_follow_softmax_of_logits_over_temperature():
    sp = SamplingParams(temperature=0.7)
    tokens = draw(Sampler(torch.device("cpu"), seed=0), requests([sp] * DRAWS))
    stat, df = chi_square(tokens, torch.softmax(LOGITS / 0.7, -1))
    assert stat < CRITICAL[df]


def test_seeded_rows_follow_the_distribution_across_seeds_and_across_steps():
    across_seeds = [SamplingParams(temperature=1.3, seed=s) for s in range(DRAWS)]
    tokens = draw(Sampler(torch.device("cpu")), requests(across_seeds))
    expected = torch.softmax(LOGITS / 1.3, -1)
    stat, df = chi_square(tokens, expected)
    assert stat < CRITICAL[df]
    # One seed, DRAWS successive tokens: the draw counter walks the stream.
    one_seed = [SamplingParams(temperature=1.3, seed=42)] * DRAWS
    tokens = draw(Sampler(torch.device("cpu")), requests(one_seed, list(range(DRAWS))))
    stat, df = chi_square(tokens, expected)
    assert stat < CRITICAL[df]


@pytest.mark.parametrize(("top_k", "top_p", "kept"), [(4, 1.0, 4), (-1, 0.6, 2), (5, 0.8, 3)])
def test_top_k_top_p_rows_follow_the_renormalised_head(top_k, top_p, kept):
    sp = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p)
    tokens = draw(Sampler(torch.device("cpu"), seed=1), requests([sp] * DRAWS))
    probs = torch.softmax(LOGITS, -1)
    head = probs.argsort(descending=True)[:kept]
    expected = torch.zeros_like(probs)
    expected[head] = probs[head] / probs[head].sum()
    stat, df = chi_square(tokens, expected)
    assert df == kept - 1 and stat < CRITICAL[df]


@pytest.mark.parametrize("top_k", [-1, 40])  # a full sort; a top-k as wide as the batch's
def test_a_seeded_row_draws_the_same_whatever_the_batch(top_k):
    vocab = 500
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(3))
    seeded = SamplingParams(temperature=0.9, top_p=0.95, top_k=top_k)
    mixes = [
        [seeded],
        [SamplingParams(temperature=0.0), seeded],
        [SamplingParams(temperature=1.0), SamplingParams(temperature=0.5, top_k=3), seeded],
        [SamplingParams(temperature=1.0, top_k=200, seed=8)] * 5 + [seeded],
    ]
    for seed in range(20):
        seeded.seed = seed
        picks = set()
        for mix in mixes:
            rows = logits[-len(mix) :].clone()
            rows[-1] = logits[0]
            reqs = requests(mix, [3] * len(mix))
            picks.add(draw(Sampler(torch.device("cpu")), reqs, rows)[-1])
        assert len(picks) == 1, seed


def test_the_uniform_depends_on_seed_and_count_only():
    assert row_uniform(7, 3) == row_uniform(7, 3)
    values = {row_uniform(s, c) for s in range(50) for c in range(50)}
    assert len(values) == 2500 and all(0.0 <= v < 1.0 for v in values)


def test_a_row_with_nothing_to_sample_fails_alone():
    logits = LOGITS.expand(3, -1).clone()
    logits[1] = float("-inf")
    logits[2, 0] = float("nan")
    sp = SamplingParams(temperature=1.0, seed=1)
    out = Sampler(torch.device("cpu")).sample(logits, requests([sp] * 3)).token_ids
    assert isinstance(out[0], int)
    assert isinstance(out[1], NoTokenToSample) and isinstance(out[2], NoTokenToSample)


def test_a_random_step_reads_the_device_back_once(monkeypatch):
    calls = []
    real = torch.Tensor.tolist

    def counting(self):  # type: ignore[no-untyped-def]
        calls.append(self.shape)
        return real(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    mix = [SamplingParams(temperature=t, top_k=k) for t, k in [(0, -1), (1, -1), (0.5, 3)] * 20]
    Sampler(torch.device("cpu")).sample(torch.randn(60, 300), requests(mix))
    assert len(calls) == 1


def test_profile_sampling_runs_on_the_meta_device():
    picked = profile_sampling(torch.empty(64, 32_000, device="meta"))
    assert picked.shape == (64,) and picked.device.type == "meta"
