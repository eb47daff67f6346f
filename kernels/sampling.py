"""Batched random sampling with reproducible per-row seeds and no per-row host sync.

Each random row brings one uniform number ``u`` in [0, 1), made on the host from the row's
seed and how many tokens it has drawn (``row_uniform``: SplitMix64 of the pair, a few
Python integer operations). The token is the inverse CDF at ``u`` of the row's
distribution, for every row at once: softmax, a float64 cumulative sum, and one
``searchsorted``. A row's token then depends only on its own logits and (seed, count),
never on what else is in the batch, and nothing on the device waits on a generator.

Rows with top-k or top-p are sorted (descending; only the top max-k candidates where
every such row sets a top-k) and cut by ``top_k_top_p_mask``; the inverse CDF runs in
sorted order and maps back through the sort's indices. Rows without
either skip the sort: the CDF in vocabulary order is just as exact.
"""

from __future__ import annotations

import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
DOUBLE = float(1 << 53)


def _splitmix64(x: int) -> int:
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def row_uniform(seed: int, counter: int) -> float:
    """A uniform in [0, 1) with 53 random bits, a pure function of (seed, counter)."""
    return (_splitmix64(_splitmix64(seed) ^ (counter & MASK64)) >> 11) / DOUBLE


def top_k_top_p_mask(
    sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """True where a token is cut, for logits sorted descending along the last dim.

    top_k [N] (vocab size = off), top_p [N] (1.0 = off). The top token always survives.
    """
    ranks = torch.arange(sorted_logits.shape[-1], device=sorted_logits.device)
    cut = ranks.unsqueeze(0) >= top_k.unsqueeze(1)
    probs = torch.softmax(sorted_logits.masked_fill(cut, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    cut |= mass_before >= top_p.unsqueeze(1)
    cut[:, 0] = False
    return cut


def inverse_cdf(scaled: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index [N] int64, bad [N] bool): the draw at u [N] float64 from softmax(scaled [N, V]).

    bad marks rows with no finite distribution (NaN, or every logit -inf); their index is
    meaningless.
    """
    # Unnormalised: exp(x - max) and a running sum. A row's CDF then does not depend on
    # how many cut (-inf, so 0) columns follow it, whatever the batch's widest top-k.
    weights = (scaled - scaled.amax(dim=-1, keepdim=True)).exp_()
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    index = torch.searchsorted(cdf, u.unsqueeze(1) * total, right=True).squeeze(1)
    bad = ~(total.squeeze(1) > 0) | ~torch.isfinite(total.squeeze(1))  # NaN compares False
    return index.clamp_(max=scaled.shape[-1] - 1), bad


def sample_rows(
    scaled: torch.Tensor,
    u: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    max_top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N], bad [N]) for logits already divided by the temperature.

    top_k/top_p None: no cut, no sort. Else top_k [N] int64 (vocab = off), top_p [N], and
    max_top_k the largest top_k (known on the host): below the vocabulary size only that
    many candidates are taken (``topk``), not a full sort; top-p then cuts within them.
    """
    if top_k is None or top_p is None:
        return inverse_cdf(scaled, u)
    vocab = scaled.shape[-1]
    if max_top_k is not None and max_top_k < vocab:
        sorted_logits, sorted_ids = scaled.topk(max_top_k, dim=-1, sorted=True)
    else:
        sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)
    sorted_logits.masked_fill_(top_k_top_p_mask(sorted_logits, top_k, top_p), float("-inf"))
    index, bad = inverse_cdf(sorted_logits, u)
    return sorted_ids.gather(1, index.unsqueeze(1)).squeeze(1), bad
