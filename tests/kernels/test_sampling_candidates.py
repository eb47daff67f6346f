"""The torch sampling path draws a cut row among its top candidates alone where they hold
every kept token (top-k cuts inside them, or top-p's share is reached inside them), and
sorts the whole row of only the other rows: the same tokens as sorting every row, and the
plain reference's."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_triton_sampling import plain_sample
from tide_fleet.kernels import sampling

VOCAB = 3000  # past PROBE, so rows with top-p alone are first drawn among candidates


@pytest.fixture
def sorted_rows(monkeypatch):  # type: ignore[no-untyped-def]
    """The row count of each whole-row call (cut_thresholds)."""
    calls: list[int] = []
    whole = sampling.cut_thresholds

    def spy(scaled, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(scaled.shape[0])
        return whole(scaled, *args, **kwargs)

    monkeypatch.setattr(sampling, "cut_thresholds", spy)
    return calls


def peaked(n: int, seed: int) -> torch.Tensor:
    """Next-token-like rows: a few dozen tokens carry most of the mass."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, VOCAB, generator=g)
    x[:, torch.randperm(VOCAB, generator=g)[:30]] += torch.linspace(10.0, 3.0, 30)
    return x


def draw(x: torch.Tensor, k: list[int], p: list[float], max_top_k: int | None):
    """(tokens, u) of sample_rows, and the tokens of sorting every row."""
    u = torch.tensor([sampling.row_uniform(5, i) for i in range(len(k))], dtype=torch.float64)
    top_k, top_p = torch.tensor(k), torch.tensor(p)
    got, bad = sampling.sample_rows(x.clone(), u, top_k, top_p, max_top_k)
    whole = sampling.inverse_cdf(x.clone(), u, sampling.cut_thresholds(x, top_k, top_p))[0]
    assert not bad.any()
    assert got.tolist() == whole.tolist()
    return got.tolist(), u.tolist()


@pytest.mark.parametrize("seed", range(3))
def test_top_p_rows_are_drawn_among_candidates(seed, sorted_rows):
    draw(peaked(4, seed), [VOCAB] * 4, [0.9, 0.5, 0.97, 0.2], max_top_k=None)
    assert sorted_rows == [4], "a peaked row sorted its whole row"  # the comparison's own


def test_top_k_rows_drawn_among_candidates_match_the_reference(sorted_rows):
    x = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(4)) * 3
    k, p = [40, 1, 64], [1.0, 1.0, 0.6]
    got, u = draw(x, k, p, max_top_k=64)
    assert sorted_rows == [3]
    assert got == [plain_sample(x[i], 1.0, k[i], p[i], u[i]) for i in range(3)]


def test_only_a_flat_row_or_a_tie_past_the_candidates_sorts_its_row(sorted_rows):
    x = peaked(4, 9)
    x[1] = torch.randn(VOCAB, generator=torch.Generator().manual_seed(6)) * 0.1  # flat
    draw(x, [VOCAB] * 4, [0.9, 0.9, 0.8, 0.95], max_top_k=None)
    assert sorted_rows == [1, 4]  # row 1 alone, then the comparison's
    tied = torch.round(torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(7)))
    tied[2] = peaked(1, 3)[0]
    sorted_rows.clear()
    got, u = draw(tied, [5, 9, 9], [1.0, 1.0, 1.0], max_top_k=9)  # rows 0, 1: ties at 2.0
    assert sorted_rows == [2, 3]
    assert got == [plain_sample(tied[i], 1.0, [5, 9, 9][i], 1.0, u[i]) for i in range(3)]
