"""Tide's one percentile, shared by the fleet simulator and the load benchmark."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (q in [0, 100]) by linear interpolation between the closest ranks,
    numpy's default: rank q/100 x (n - 1) into the sorted values. ValueError for no values."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    s = sorted(values)
    rank = q / 100 * (len(s) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (rank - lo)
