"""Turn a step's logits into next tokens: logits processing, then greedy, temperature,
top-k, top-p, with per-request seeds.

Order per row (only rows that set an option are touched, so plain greedy rows stay
bit-identical): raw logprobs are read first; then logit_bias, min_tokens, penalties
(repetition, frequency, presence) and the grammar mask; then sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from worker.engine.grammar import GrammarMasks
from worker.engine.logits_processors import (
    apply_logit_bias,
    apply_penalties,
    apply_token_bitmask,
    mask_tokens,
    raw_logprobs,
    top_logprobs,
)
from worker.engine.request import Request, TokenLogprob
from worker.engine.sampling_params import SamplingParams


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


@dataclass
class SamplerOutput:
    """Per row: the token, or the exception that row raised (the request fails alone);
    and its logprobs when the request asked for them."""

    token_ids: list[int | Exception]
    logprobs: list[TokenLogprob | None]


class Sampler:
    """Holds one generator per seeded request so its draws do not depend on batching."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._generators: dict[str, torch.Generator] = {}
        self._prompt_ids: dict[str, torch.Tensor] = {}  # for repetition_penalty
        self._default = torch.Generator(device=device)
        self._default.seed()

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self._prompt_ids.pop(request_id, None)

    def _generator(self, request_id: str, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._default
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)
            self._generators[request_id] = gen
        return gen

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

    def _choose(self, logits: torch.Tensor, requests: Sequence[Request]) -> list[int | Exception]:
        greedy = logits.argmax(dim=-1).tolist()
        params = [r.params for r in requests]
        random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if not random_rows:
            return list(greedy)
        out: list[int | Exception] = list(greedy)
        rows = torch.tensor(random_rows, device=logits.device)
        vocab = logits.shape[-1]
        temps = torch.tensor([params[i].temperature for i in random_rows], device=logits.device)
        top_k = torch.tensor(
            [params[i].top_k if params[i].top_k > 0 else vocab for i in random_rows],
            device=logits.device,
        )
        top_p = torch.tensor([params[i].top_p for i in random_rows], device=logits.device)
        scaled = logits[rows] / temps.unsqueeze(1)
        sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)
        sorted_logits = sorted_logits.masked_fill(
            top_k_top_p_mask(sorted_logits, top_k, top_p), float("-inf")
        )
        probs = torch.softmax(sorted_logits, dim=-1)
        for j, i in enumerate(random_rows):
            try:
                gen = self._generator(requests[i].request_id, params[i])
                pick = torch.multinomial(probs[j], 1, generator=gen)
                out[i] = int(sorted_ids[j, pick].item())
            except Exception as e:
                out[i] = e
        return out
