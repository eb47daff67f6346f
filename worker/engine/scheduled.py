"""What a step runs: each scheduled request's share of it (the scheduler's output, the
model runner's input)."""

from __future__ import annotations

from dataclasses import dataclass, field

PLACEHOLDER = -1  # an input token sampled in a step the host has not read yet (overlap.py)


@dataclass
class ScheduledRequest:
    """One request's share of a step: tokens [start, start + len(token_ids))."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool
    lora_slot: int = -1  # the LoRA slot its rows read (-1: the base model)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
