"""Batched sampling with reproducible per-row seeds and no per-row host sync: the torch path,
and the semantics that it and the one-launch Triton kernel (``kernels/triton_sampling.py``)
both implement, token for token.

Per row: logits x [V] (float32), temperature T (0: greedy), top_k k (<= 0 or >= V: off),
top_p p (1: off), and one uniform u in [0, 1) (float64) made on the host from the row's seed
and how many tokens it has drawn (``row_uniform``: SplitMix64 of the pair). A row's token
depends only on its own logits and (seed, count), never on what else is in the batch.

- Greedy (T = 0): the first index of the maximum (``torch.argmax``). ``bad`` when the row
  holds a NaN or every logit is -inf; its token is then meaningless (but in range).
- Random: s = x / T (float32, correctly rounded). The kept set is {s >= threshold}: ties
  are kept or cut together, so a cut may keep more tokens than k.
  - top-k: the threshold t_k is the k-th largest s (vLLM's threshold top-k).
  - top-p, over the top-k-kept tokens: with weights w = exp(s - max s) (float32) and M the
    float64 sum of the kept w, a token of value v is cut when the kept w of values strictly
    above v sum (float64) to >= p x M (p read as float32). The top token always survives.
  - the draw: the inverse CDF at u in vocabulary order over the kept w: the first index i
    with cdf[i] > u x total (cdf: float64 running sums, total = cdf[V-1]); where u x total
    rounds up to the total itself, the first i with cdf[i] >= it.
  - ``bad`` when the total is not finite and positive (a NaN, +inf, or every logit -inf).

The torch path finds the thresholds of rows that cut among their top candidates (``topk``
of the widest top-k plus one, or ``PROBE`` values for top-p alone) and draws among those
alone where they hold every kept token, which a next-token distribution's top-p share
usually is (top-p 0.9 over 64 peaked rows of 49,152: 4.5-7x faster than sorting whole
rows, scripts/bench_sampling.py); a flat row or a tie past them sorts the whole row.
float64 sums are added in another order than the kernel's, so the paths can disagree only
where u x total or p x M lands within a few ulps of a boundary.
"""

from __future__ import annotations

import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
DOUBLE = float(1 << 53)
NEG_INF = float("-inf")
# Candidates a row with top-p and no top-k is first drawn among: SmolLM2-135M's top-p 0.9
# share lay within 1,024 tokens in 92% of 240 next-token distributions at T=1 (76% within
# 256); a flatter row sorts its whole row.
PROBE = 1024


def _splitmix64(x: int) -> int:
    x = (x + GOLDEN) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def row_uniform(seed: int, counter: int) -> float:
    """A uniform in [0, 1) with 53 random bits, a pure function of (seed, counter)."""
    return (_splitmix64(_splitmix64(seed) ^ (counter & MASK64)) >> 11) / DOUBLE


def greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax [N], bad [N]): bad where the row holds a NaN (argmax picks one) or is all -inf."""
    tokens = logits.argmax(dim=-1)
    top = logits.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens, ~(top > NEG_INF)


def cut_thresholds(
    scaled: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    max_top_k: int | None = None,
) -> torch.Tensor:
    """The smallest kept value [N] of each row of scaled [N, V] under top_k [N] (<= 0 or
    >= V: off) and top_p [N] float32 (1: off); -inf where nothing is cut.

    max_top_k: the largest top_k, where every row sets one below V (known on the host):
    only that many candidates are sorted (``topk``), not the whole row."""
    vocab = scaled.shape[1]
    width = vocab if max_top_k is None or max_top_k >= vocab else max(1, max_top_k)
    if width < vocab:
        ordered = scaled.topk(width, dim=-1, sorted=True).values
    else:
        ordered = scaled.sort(dim=-1, descending=True).values
    t_k = _kth(ordered, top_k, vocab)
    top = scaled.amax(dim=-1, keepdim=True)
    return _thresholds(ordered, top, t_k, top_p, _kept_mass(scaled, top, t_k))


def _kth(ordered: torch.Tensor, top_k: torch.Tensor, vocab: int) -> torch.Tensor:
    """t_k [N]: the k-th of each row's values sorted descending (-inf where top-k is off)."""
    k = top_k.long()
    on = (k > 0) & (k < vocab)
    kth = ordered.gather(1, (k.clamp(1, ordered.shape[1]) - 1).unsqueeze(1)).squeeze(1)
    return torch.where(on, kth, NEG_INF)


def _kept_mass(x: torch.Tensor, top: torch.Tensor, t_k: torch.Tensor) -> torch.Tensor:
    """The float64 sum [N] of exp(x - top) over each row's values >= t_k."""
    weights = (x - top).exp_().masked_fill_(~(x >= t_k.unsqueeze(1)), 0.0)
    return weights.sum(dim=-1, dtype=torch.float64)


def _thresholds(
    ordered: torch.Tensor, top: torch.Tensor, t_k: torch.Tensor, top_p: torch.Tensor,
    mass: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """max(t_k, t_p) [N]: t_p from the values sorted descending (the whole row, or a prefix
    holding every kept one) and the top-k-kept ``mass`` of the whole row."""
    need = top_p.double() * mass
    ordered_w = (ordered - top).exp_().masked_fill_(~(ordered >= t_k.unsqueeze(1)), 0.0)
    above = ordered_w.cumsum(dim=-1, dtype=torch.float64)  # kept mass up to each position
    # The last position whose mass before it is < need (the mass before position j is
    # above[j - 1]; before position 0 none): its value is the smallest kept one.
    last = (above[:, :-1] < need.unsqueeze(1)).sum(dim=-1)
    t_p = torch.where(top_p < 1.0, ordered.gather(1, last.unsqueeze(1)).squeeze(1), NEG_INF)
    return torch.maximum(t_k, t_p)


def inverse_cdf(
    scaled: torch.Tensor, u: torch.Tensor, threshold: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(index [N] int64, bad [N] bool): the draw at u [N] float64 from exp(scaled [N, V] -
    max), over the tokens >= threshold [N] where given (else all of them).

    bad marks rows with no finite distribution (NaN, or every logit -inf); their index is
    meaningless (but in range)."""
    weights = (scaled - scaled.amax(dim=-1, keepdim=True)).exp_()
    if threshold is not None:
        weights.masked_fill_(~(scaled >= threshold.unsqueeze(1)), 0.0)
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)
    del weights
    total = cdf[:, -1]
    target = (u * total).unsqueeze(1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    at_end = torch.searchsorted(cdf, target).squeeze(1)  # u x total rounded up to the total
    index = torch.where(target.squeeze(1) >= total, at_end, index)
    bad = ~(total > 0) | ~torch.isfinite(total)  # NaN compares False
    return index.clamp_(max=scaled.shape[-1] - 1), bad


def sample_rows(
    scaled: torch.Tensor,
    u: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    max_top_k: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N], bad [N]) for logits already divided by the temperature.

    top_k/top_p None: no cut, no sort. Else top_k [N] int64 (vocab = off), top_p [N]
    float32, and max_top_k as ``cut_thresholds`` takes it. Each row is first drawn among its
    top max_top_k + 1 values (``PROBE`` where some row sets no top-k below V), which hold
    every kept token when top-k cuts there or top-p's share is reached there; only the
    other rows sort their whole row."""
    if top_k is None or top_p is None:
        return inverse_cdf(scaled, u)
    vocab = scaled.shape[-1]
    width = max_top_k + 1 if max_top_k is not None and max_top_k < vocab else PROBE
    if width >= vocab:
        return inverse_cdf(scaled, u, cut_thresholds(scaled, top_k, top_p, max_top_k))
    inside, (tokens, bad) = _among_candidates(scaled, u, top_k, top_p, width)
    rest = (~inside).nonzero().squeeze(1)  # one host read
    if len(rest):
        x = scaled[rest]
        threshold = cut_thresholds(x, top_k[rest], top_p[rest], max_top_k)
        tokens[rest], bad[rest] = inverse_cdf(x, u[rest], threshold)
    return tokens, bad


def _among_candidates(
    scaled: torch.Tensor, u: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, width: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """(inside [N], ``sample_rows``'s draw): the draw from each row's top ``width`` values
    alone, which is the row's where ``inside``: its kept tokens are all among them, as when
    its top-k threshold is above the last of them, or (no top-k) the mass above the last
    reaches its top-p share. The kept weights, in vocabulary order, add up exactly as over
    the whole row (a cut token adds 0), so the token is the same. A row with a NaN, all
    -inf, or a top-k at or past ``width`` is never inside."""
    vocab = scaled.shape[1]
    k = top_k.long()
    k_on = (k > 0) & (k < vocab)
    values, ids = scaled.topk(width, dim=-1, sorted=True)
    top, last = values[:, :1], values[:, -1]
    t_k = _kth(values, top_k, vocab)  # where k >= width: the last value, so never inside
    mass = _kept_mass(values, top, t_k)  # right where top-k keeps only candidates
    loose = (~k_on).nonzero().squeeze(1)  # rows whose whole row is kept before top-p
    if len(loose):
        mass[loose] = _kept_mass(scaled[loose], top[loose], t_k[loose])
    above_last = _kept_mass(values, top, last.nextafter(torch.full_like(last, float("inf"))))
    reached = (top_p < 1.0) & (above_last >= top_p.double() * mass)
    inside = torch.where(k_on, last < t_k, reached)
    threshold = _thresholds(values, top, t_k, top_p, mass)
    order = ids.argsort(dim=-1)  # the candidates in vocabulary order
    index, bad = inverse_cdf(values.gather(1, order), u, threshold)
    return inside, (ids.gather(1, order).gather(1, index.unsqueeze(1)).squeeze(1), bad)
