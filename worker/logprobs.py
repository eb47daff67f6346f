"""Logprob entries in the wire shape the gateway reads (a job's ``choices`` and its deltas).

One entry per sampled token: ``{"token", "bytes", "logprob", "top_logprobs"}``, where
``token`` is the UTF-8 of ``bytes`` (decoded with errors="replace": a token can carry part
of a character) and ``top_logprobs`` lists the alternatives best first, in the same shape
without their own ``top_logprobs``. A logprob that is not finite is written as -9999.0
(vLLM's stand-in), so the JSON stays valid.
"""

from __future__ import annotations

import math
from typing import Any

from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.worker.engine.request import TokenLogprob

NOT_FINITE = -9999.0


class LogprobEntries:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer  # None (an engine without one): every token is b""

    def __call__(self, logprobs: list[TokenLogprob]) -> list[dict[str, Any]]:
        return [self.entry(lp) for lp in logprobs]

    def entry(self, lp: TokenLogprob) -> dict[str, Any]:
        top = sorted(lp.top_logprobs.items(), key=lambda kv: -kv[1])
        return self._token(lp.token_id, lp.logprob) | {
            "top_logprobs": [self._token(t, v) for t, v in top]
        }

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.tokenizer.token_bytes(token_id) if self.tokenizer is not None else b""
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "bytes": list(raw),
            "logprob": float(logprob) if math.isfinite(logprob) else NOT_FINITE,
        }
