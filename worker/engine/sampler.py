"""Turn a step's logits into next tokens: logits processing, then greedy, temperature,
top-k, top-p, with per-request seeds.

Sampling is batched, with the semantics of ``kernels/sampling.py``: one host-to-device copy
of the rows' options per step (pinned and non-blocking on CUDA), then either one Triton
launch for every row (``kernels/triton_sampling.py``, where the kernel table names triton
for the op ``sampling``: the CUDA default) or the torch path (an argmax, one inverse-CDF
draw for the random rows; a row that asks for top-k or top-p drawn among its top
candidates where they hold every token it keeps, else its whole row sorted), and one read
of the step's tokens back to the host. A seeded request's draw is a pure function of its
seed and how many tokens it has produced, so it does not depend on the batch (nor on
preemption); unseeded rows take the host generator's draws in row order on either path.

Order per row (only rows that set an option are touched, so plain greedy rows stay
bit-identical): raw logprobs are read first; then logit_bias, min_tokens, penalties
(repetition, frequency, presence) and the grammar mask; then sampling.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tide_fleet.kernels import dispatch
from tide_fleet.kernels.sampling import (
    cut_thresholds,
    greedy,
    inverse_cdf,
    row_uniform,
    sample_rows,
)
from tide_fleet.worker.engine.logits_processors import (
    apply_logit_bias,
    apply_penalties,
    apply_token_bitmask,
    mask_tokens,
    raw_logprobs,
    top_logprobs,
)
from tide_fleet.worker.engine.request import Request, TokenLogprob

if TYPE_CHECKING:
    from tide_fleet.worker.engine.grammar import GrammarMasks

__all__ = ["Sampler", "SamplerOutput", "profile_sampling"]

# Rows of the per-step option block, one column per sampled row (float64: exact for ints).
ROW, TEMP, TOP_K, TOP_P, UNIFORM = range(5)


NO_TOKEN = "no token to sample: the logits are NaN or every token is cut"


class NoTokenToSample(ValueError):
    """The row's logits are NaN, or every token is cut."""


@dataclass
class SamplerOutput:
    """Per row: the token, or the exception that row raised (the request fails alone);
    and its logprobs when the request asked for them."""

    token_ids: list[int | Exception]
    logprobs: list[TokenLogprob | None]


class Sampler:
    """Seeded rows draw from (seed, tokens produced so far); unseeded rows from a host
    generator (``seed`` fixes it, for tests)."""

    def __init__(self, device: torch.device, seed: int | None = None) -> None:
        self.device = device
        self._prompt_ids: dict[str, torch.Tensor] = {}  # for repetition_penalty
        self._rng = random.Random(seed)
        # The option block's host buffers (pinned), used in turn: the overlapped loop writes
        # a step's options while the copy of the step before may still be queued.
        self._hosts: list[torch.Tensor | None] = [None, None]
        self._turn = 0

    def forget(self, request_id: str) -> None:
        self._prompt_ids.pop(request_id, None)

    @torch.inference_mode()  # the model's logits are inference tensors; edits stay in that mode
    def sample(
        self, logits: torch.Tensor, requests: Sequence[Request], masks: GrammarMasks | None = None
    ) -> SamplerOutput:
        """One token per row of logits (row i is requests[i]); logits are edited in place."""
        lp_rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        raw = raw_logprobs(logits, lp_rows) if lp_rows else None
        self._process(logits, requests, masks)
        tokens = self._choose(logits, requests)
        logprobs: list[TokenLogprob | None] = [None] * len(requests)
        # (row of raw, row of the batch, token) for rows that asked and did not fail
        done = [
            (j, i, t) for j, i in enumerate(lp_rows) if not isinstance(t := tokens[i], Exception)
        ]
        if raw is not None and done:
            picked, tops = top_logprobs(
                raw[[j for j, _, _ in done]],
                [t for _, _, t in done],
                [requests[i].params.logprobs or 0 for _, i, _ in done],
            )
            for (_, i, token), lp, top in zip(done, picked, tops, strict=True):
                logprobs[i] = TokenLogprob(token, lp, top)
        return SamplerOutput(tokens, logprobs)

    def _process(
        self, logits: torch.Tensor, requests: Sequence[Request], masks: GrammarMasks | None
    ) -> None:
        """Apply each option to its rows. A row left with no allowed token samples one the
        grammar then refuses, and fails alone there (GrammarMatchers.accept)."""
        bias_rows, min_rows, pen_rows = [], [], []
        for i, r in enumerate(requests):
            p = r.params
            if not p.needs_logits_processing:
                continue
            if p.logit_bias:
                bias_rows.append(i)
            if r.num_output_tokens < p.min_tokens:
                min_rows.append(i)
            if p.has_penalties:
                pen_rows.append(i)
        if bias_rows:
            apply_logit_bias(
                logits, bias_rows, [requests[i].params.logit_bias or {} for i in bias_rows]
            )
        if min_rows:
            mask_tokens(logits, min_rows, [requests[i].stop_token_ids for i in min_rows])
        if pen_rows:
            pen = [requests[i] for i in pen_rows]
            apply_penalties(
                logits,
                pen_rows,
                [self._prompt_tensor(r) for r in pen],
                [torch.tensor(r.output_token_ids, dtype=torch.long) for r in pen],
                presence=[r.params.presence_penalty for r in pen],
                frequency=[r.params.frequency_penalty for r in pen],
                repetition=[r.params.repetition_penalty for r in pen],
            )
        if masks is not None:
            apply_token_bitmask(logits, masks.rows, torch.from_numpy(masks.bits))

    def _prompt_tensor(self, request: Request) -> torch.Tensor:
        if request.params.repetition_penalty == 1.0:
            return torch.empty(0, dtype=torch.long)
        ids = self._prompt_ids.get(request.request_id)
        if ids is None:
            ids = torch.tensor(request.prompt_token_ids, dtype=torch.long)
            self._prompt_ids[request.request_id] = ids
        return ids

    @torch.inference_mode()
    def sample_on_device(
        self, logits: torch.Tensor, requests: Sequence[Request]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row, left on the device with no host read: (tokens, failed rows).
        For rows with no logits processing, logprobs or grammar (worker/engine/overlap.py)."""
        return self._choose_tensors(logits, requests)

    def _choose(self, logits: torch.Tensor, requests: Sequence[Request]) -> list[int | Exception]:
        tokens, bad = self._choose_tensors(logits, requests)
        out: list[int | Exception] = []
        for token, failed in zip(*torch.stack([tokens, bad.long()]).tolist(), strict=True):
            out.append(NoTokenToSample(NO_TOKEN) if failed else token)
        return out

    def _choose_tensors(
        self, logits: torch.Tensor, requests: Sequence[Request]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        vocab = logits.shape[-1]
        if dispatch.impl("sampling", logits.device) == "triton":
            from tide_fleet.kernels import triton_sampling  # triton: not every install has it

            o = self._options(vocab, requests, list(range(len(requests))))  # greedy: T = 0
            return triton_sampling.sample(logits, o[TEMP], o[TOP_K], o[TOP_P], o[UNIFORM])
        tokens, bad = greedy(logits)
        random_rows = [i for i, r in enumerate(requests) if not r.params.is_greedy]
        if not random_rows:
            return tokens, bad
        # Rows without top-k/top-p first: each kind is then one slice of the option block.
        plain = [i for i in random_rows if not _cuts(requests[i], vocab)]
        cut = [i for i in random_rows if _cuts(requests[i], vocab)]
        opts = self._options(vocab, requests, plain + cut)
        max_k = max((_top_k(requests[i], vocab) for i in cut), default=vocab)
        for o, filtered in ((opts[:, : len(plain)], False), (opts[:, len(plain) :], True)):
            if o.shape[1] == 0:
                continue
            rows = o[ROW].long()
            scaled = logits[rows] / o[TEMP].float().unsqueeze(1)
            top_k, top_p = (o[TOP_K].long(), o[TOP_P].float()) if filtered else (None, None)
            picked, failed = sample_rows(scaled, o[UNIFORM], top_k, top_p, max_k)
            tokens[rows] = picked
            bad[rows] = failed
        return tokens, bad

    def _options(self, vocab: int, requests: Sequence[Request], columns: list[int]) -> torch.Tensor:
        """[5, n] float64 on the device, a column per row in ``columns``: row, temperature
        (0 for a greedy row), top_k (vocab: off), top_p, uniform. Unseeded rows take the host
        generator's draws in row order, whatever the columns' order."""
        n = len(columns)
        uniform = {i: self._uniform(requests[i]) for i in sorted(columns)}
        host = self._host_buffer(5 * n)
        block = host.numpy()[: 5 * n].reshape(5, n)
        for j, i in enumerate(columns):
            p = requests[i].params
            temperature = 0.0 if p.is_greedy else p.temperature
            block[:, j] = (i, temperature, _top_k(requests[i], vocab), p.top_p, uniform[i])
        view = host[: 5 * n].view(5, n)
        if self.device.type == "cpu":
            return view.clone()  # the buffer is reused by the next step
        return view.to(self.device, non_blocking=True)  # done before the step's .tolist()

    def _uniform(self, request: Request) -> float:
        p = request.params
        if p.is_greedy:
            return 0.0
        seed = p.seed if p.seed is not None else self._rng.getrandbits(63)
        # (a token sampled but not read yet counts: the draw is the serial loop's)
        count = request.num_output_tokens + request.pending if p.seed is not None else 0
        return row_uniform(seed, count)

    def _host_buffer(self, size: int) -> torch.Tensor:
        self._turn ^= 1
        host = self._hosts[self._turn]
        if host is None or host.numel() < size:
            pin = self.device.type == "cuda"
            host = torch.empty(max(size, 5 * 64), dtype=torch.float64, pin_memory=pin)
            self._hosts[self._turn] = host
        return host


def _top_k(request: Request, vocab: int) -> int:
    k = request.params.top_k
    return k if 0 < k < vocab else vocab


def _cuts(request: Request, vocab: int) -> bool:
    p = request.params
    return 0 < p.top_k < vocab or p.top_p < 1.0


def profile_sampling(logits: torch.Tensor) -> torch.Tensor:
    """The sampler's most memory-hungry path on logits [N, vocab], on any device, for the
    model runner's profiling run: the torch path with every row random, top-k and top-p
    (sorted). Where the table names triton here, its kernel is launched too (compiled
    before serving; it needs no memory beyond its outputs)."""
    n, vocab = logits.shape
    dev = logits.device
    u = torch.full((n,), 0.5, dtype=torch.float64, device=dev)
    top_k = torch.full((n,), max(1, vocab // 2), dtype=torch.long, device=dev)
    top_p = torch.full((n,), 0.9, device=dev)
    greedy_tokens, _ = greedy(logits)
    scaled = logits / 0.7  # every row's whole row sorted: the path's largest tensors
    picked, _ = inverse_cdf(scaled, u, cut_thresholds(scaled, top_k, top_p))
    if dispatch.impl("sampling", dev) == "triton":
        from tide_fleet.kernels import triton_sampling

        temperature = torch.full((n,), 0.7, device=dev)
        picked, _ = triton_sampling.sample(logits, temperature, top_k, top_p, u)
    return torch.where(picked >= 0, picked, greedy_tokens)
