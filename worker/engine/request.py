"""A request's state inside the engine: its tokens, progress and timings."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from tide_fleet.infra.contract.sampling_params import Priority, SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class TokenLogprob:
    """A sampled token's logprob and the top alternatives {token id: logprob}, best first.

    Raw model logprobs: log_softmax of the logits before bias, penalties, grammar mask and
    temperature (see SamplingParams.logprobs).
    """

    token_id: int
    logprob: float
    top_logprobs: dict[int, float] = field(default_factory=dict)


@dataclass
class RequestTimings:
    """Wall-clock seconds (time.time()) at each milestone; None until reached."""

    arrival: float = field(default_factory=time.time)
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None


class Request:
    """Tokens of one sequence and how many of them have KV computed.

    There are no prefill and decode phases: ``num_computed_tokens`` catches up with
    ``num_tokens`` under the scheduler's per-step budget. A step that brings it level
    samples one new token.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: Priority = Priority.INTERACTIVE,
        arrival_seq: int = 0,
        group: str | None = None,
        lora: str | None = None,
        cache_salt: int = 0,
    ) -> None:
        self.request_id = request_id
        # The job it belongs to (a job's choices, a request's prompts): the unit of fair
        # shares in the scheduler (worker/engine/fair_share.py). Alone, its own group.
        self.group = group or request_id
        # The LoRA adapter it runs under (None: the base), and the prefix cache's root for
        # it: KV computed under one adapter is never served to another.
        self.lora = lora
        self.cache_salt = cache_salt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[TokenLogprob] = []  # when params.logprobs is set
        self.all_token_ids = list(prompt_token_ids)
        self.params = params
        self.priority = priority
        self.arrival_seq = arrival_seq
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        # Tokens sampled in a step whose results the host has not read yet (the overlapped
        # loop, worker/engine/overlap.py): 0 or 1; always 0 in the serial loop.
        self.pending = 0
        self.num_preemptions = 0
        self.stop_token_ids: frozenset[int] = frozenset()  # set by the engine on admission
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.timings = RequestTimings()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_sampled_tokens(self) -> int:
        """Its tokens and the one sampled but not read yet, if any: what the scheduler runs."""
        return len(self.all_token_ids) + self.pending

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def sort_key(self) -> tuple[int, int]:
        """Interactive before batch, first come first served within a class."""
        return (int(self.priority), self.arrival_seq)

    def append_token(self, token_id: int, logprob: TokenLogprob | None = None) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if logprob is not None:
            self.output_logprobs.append(logprob)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens})"
        )
