"""What a worker holds: its jobs (one lease each) and their choices (one engine request each).

A job asks for n choices (``sampling.n``, 1 by default). Each is its own engine request;
the job is one job everywhere else (one lease, one message, one result), and it ends
when every choice has. Its status: failed if any choice ended with an error, cancelled if
any was aborted, else completed. Its result: ``text`` and ``finish_reason`` of choice 0,
``completion_tokens`` summed over the choices, and ``choices``, one entry per choice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.protocol import JobStatus


@dataclass
class Choice:
    """One of a job's choices: its engine request and, once it ended, what it produced."""

    index: int
    request_id: str
    added: bool = False  # in the engine (the others wait for choice 0's prompt blocks)
    done: bool = False
    text: str = ""
    finish_reason: str | None = None  # stop | length | abort | error
    error: str | None = None
    completion_tokens: int = 0
    logprobs: list[dict[str, Any]] | None = None  # wire entries, when the job asked
    # What an earlier attempt produced and wrote (tide_fleet.worker.resume): the request goes on
    # from these tokens; their logprob entries are kept as written.
    kept_tokens: list[int] = field(default_factory=list)
    kept_logprobs: list[dict[str, Any]] = field(default_factory=list)

    def end(self, reason: str, error: str | None = None) -> None:
        """Ended without an engine output (aborted before it was added, or rejected)."""
        self.done, self.finish_reason, self.error = True, reason, error

    def wire(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
            "logprobs": self.logprobs,
        }


@dataclass
class HeldJob:
    job_id: str
    token: str
    tenant: str
    message: queues.Delivery
    has_webhook: bool
    streams: bool = True  # batch jobs publish no per-step deltas: nobody follows them live
    first_token_at: float | None = None
    started: bool = False  # the engine has computed some of it (marked in Redis once)
    work: int = 0  # prompt + n x max tokens: what its choices may compute
    created_at: float = 0.0  # the job record's (queue time counts from it)
    cold_start_s: float | None = None  # the worker start it waited through (tide_fleet.worker.boot)
    logprobs: bool = False  # sampling.logprobs was set: entries per token are written
    ended: bool = False  # its terminal result is recorded (tide_fleet.worker.results)
    group: str | None = None  # fair-share group in the engine (tide_fleet.worker.choices.JobSpec)
    lora: str | None = None  # the LoRA adapter its choices run on (None: the base model)
    choices: list[Choice] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return bool(self.choices) and all(c.done for c in self.choices)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    def status(self) -> JobStatus:
        reasons = {c.finish_reason for c in self.choices}
        if "error" in reasons:
            return JobStatus.FAILED
        if "abort" in reasons:
            return JobStatus.CANCELLED
        return JobStatus.COMPLETED

    def error(self) -> str | None:
        """The first failed choice's error; it names the choice when there are several."""
        failed = next((c for c in self.choices if c.finish_reason == "error"), None)
        if failed is None:
            return None
        error = failed.error or "failed"
        return error if len(self.choices) == 1 else f"choice {failed.index}: {error}"

    def result(self) -> dict[str, Any]:
        """The result fields written with its terminal status."""
        first = self.choices[0]
        return {
            "text": first.text,
            "finish_reason": first.finish_reason,
            "completion_tokens": self.completion_tokens,
            "choices": [c.wire() for c in self.choices],
        }


class Held:
    """The held jobs by job id (a read-only mapping), and their choices by request id."""

    def __init__(self) -> None:
        self._jobs: dict[str, HeldJob] = {}
        self._choices: dict[str, tuple[HeldJob, Choice]] = {}

    def add(self, job: HeldJob) -> None:
        self._jobs[job.job_id] = job
        for c in job.choices:
            self._choices[c.request_id] = (job, c)

    def pop(self, job_id: str) -> HeldJob | None:
        job = self._jobs.pop(job_id, None)
        if job is not None:
            for c in job.choices:
                self._choices.pop(c.request_id, None)
        return job

    def choice(self, request_id: str) -> tuple[HeldJob, Choice] | None:
        return self._choices.get(request_id)

    def clear(self) -> None:
        self._jobs.clear()
        self._choices.clear()

    @property
    def num_sequences(self) -> int:
        """Choices not ended yet: the sequence slots the held jobs take."""
        return sum(1 for _, c in self._choices.values() if not c.done)

    def get(self, job_id: str) -> HeldJob | None:
        return self._jobs.get(job_id)

    def values(self) -> list[HeldJob]:
        return list(self._jobs.values())

    def items(self) -> list[tuple[str, HeldJob]]:
        return list(self._jobs.items())

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __getitem__(self, job_id: str) -> HeldJob:
        return self._jobs[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._jobs))

    def __len__(self) -> int:
        return len(self._jobs)
