"""Tide's one percentile: numpy's default (linear interpolation between closest ranks)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tide_fleet.infra.stats import percentile


def test_percentiles_match_numpy() -> None:
    rng = random.Random(5)
    for n in (1, 2, 4, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentiles_by_hand() -> None:
    assert percentile(list(range(1, 11)), 50) == 5.5
    assert percentile([4.0], 99) == 4.0
    waits = [25, 0, 20, 10]  # unsorted is fine
    assert percentile(waits, 50) == 15  # halfway from the 2nd to the 3rd
    assert percentile(waits, 99) == pytest.approx(24.85)  # 97% of the way from the 3rd
    assert (percentile(waits, 0), percentile(waits, 100)) == (0, 25)


def test_no_values_or_q_outside_0_to_100_is_an_error() -> None:
    with pytest.raises(ValueError, match="percentile of no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\], got 101"):
        percentile([1.0], 101)
