"""What the engine reports: a RequestOutput per request per step, StepStats per model step."""

from __future__ import annotations

from dataclasses import dataclass, field

from tide_fleet.worker.engine.request import RequestTimings, TokenLogprob


@dataclass
class RequestOutput:
    """What one step produced for one request. Deltas concatenate to the final text.

    new_logprobs: one TokenLogprob per new token when the request set ``logprobs``
    (empty otherwise); ``logprobs`` holds them all once finished (None when not asked).
    """

    request_id: str
    new_token_ids: list[int]
    delta_text: str
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    error: str | None = None
    new_logprobs: list[TokenLogprob] = field(default_factory=list)
    # Filled when finished:
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    timings: RequestTimings | None = None
    logprobs: list[TokenLogprob] | None = None


@dataclass
class StepStats:
    """What one model step did, for metrics (worker/metrics.py turns it into MFU/MBU).

    kv_tokens_read: KV positions attention read (each row's whole context);
    attn_context_sum: over every token, the positions it attended to (its FLOPs).
    """

    num_seqs: int = 0
    num_sampled: int = 0
    num_decode_tokens: int = 0  # one-token rows of requests past their prompt
    num_prefill_tokens: int = 0  # prompt chunks, and recomputation after a preemption
    kv_tokens_read: int = 0
    attn_context_sum: int = 0
    duration_s: float = 0.0

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens

    @property
    def kind(self) -> str:
        if not self.num_prefill_tokens:
            return "decode"
        return "prefill" if not self.num_decode_tokens else "mixed"

    def add(self, num_tokens: int, start_pos: int, num_prompt_tokens: int) -> int:
        """Count one request's rows of the step; returns how many were prompt tokens (a
        recomputation after a preemption is prefill work, not prompt)."""
        self.num_seqs += 1
        if num_tokens == 1 and start_pos >= num_prompt_tokens:  # a decode
            self.num_decode_tokens += num_tokens
        else:
            self.num_prefill_tokens += num_tokens
        self.kv_tokens_read += start_pos + num_tokens
        self.attn_context_sum += num_tokens * start_pos + num_tokens * (num_tokens + 1) // 2
        end = start_pos + num_tokens
        return max(0, min(end, num_prompt_tokens) - min(start_pos, num_prompt_tokens))
