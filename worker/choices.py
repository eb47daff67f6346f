"""A job's choices in the engine: what its record asks for (``JobSpec``: prompt, sampling,
``n`` popped from it, priority), the choices' request ids and seeds, adding and aborting them.

Choice i of job j is engine request ``j#i`` (a job of one choice keeps the plain job id),
with seed ``seed + i`` (so choice 0 samples exactly as a job of one choice does; no seed
stays none). Every choice has the job's prompt token ids and priority; a resumed choice
also its kept output tokens (``tide_fleet.worker.resume``).

Sharing the prompt: the engine hashes a full KV block for the prefix cache only after
the step that computed it, so choices admitted in the same step would each compute the
whole prompt. Choice 0 is added first; the others once it has computed the prompt's
full blocks (or ended), and they then hit the prefix cache for those blocks. Where there
is nothing to share (one choice, a prompt shorter than a block plus one token, prefix
caching off) all are added at once.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tide_fleet.infra.wire.protocol import Priority as WirePriority
from tide_fleet.worker.engine import LLMEngine, Priority, SamplingParams
from tide_fleet.worker.held import Choice, Held, HeldJob

SEED_RANGE = 2**63  # SamplingParams' seeds; seed + i wraps around inside it
NORMAL_END = ("stop", "length")
AddHook = Callable[[HeldJob, str], None]
# The wire's priority classes and the engine's (which knows nothing of the wire), one table.
ENGINE_PRIORITY = {
    WirePriority.INTERACTIVE: Priority.INTERACTIVE,
    WirePriority.BATCH: Priority.BATCH,
}


def pop_n(sampling: dict[str, Any]) -> int:
    """Take the number of choices out of a record's sampling fields (1 when absent)."""
    n = sampling.pop("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer of at least 1, got {n!r}")
    return n


@dataclass
class JobSpec:
    """What a job record asks of the engine: a prompt, n choices, their sampling."""

    prompt: list[int]
    params: SamplingParams
    n: int
    priority: Priority
    group: str  # the fair-share group: the request it came in (its own id when alone)
    lora: str | None = None  # the LoRA adapter it runs on (the record's `lora`; None: base)

    @classmethod
    def from_record(cls, record: dict[str, str]) -> JobSpec:
        """Raises ValueError, TypeError or KeyError for a record the engine cannot run."""
        sampling = dict(json.loads(record["sampling"]))
        n = pop_n(sampling)
        wire = WirePriority(record.get("priority") or WirePriority.INTERACTIVE)
        prompt = list(json.loads(record["token_ids"]))
        group = record.get("group") or record["id"]
        lora = record.get("lora") or None
        return cls(prompt, SamplingParams(**sampling), n, ENGINE_PRIORITY[wire], group, lora)


def request_id(job_id: str, index: int, n: int) -> str:
    return job_id if n == 1 else f"{job_id}#{index}"


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    if params.seed is None or index == 0:
        return params
    return dataclasses.replace(params, seed=(params.seed + index) % SEED_RANGE)


@dataclass
class _Waiting:
    """What choices 1..n-1 of a job need, kept until choice 0's prompt blocks are cached."""

    job: HeldJob
    prompt: list[int]
    params: SamplingParams
    priority: Priority
    shared_tokens: int  # choice 0 has computed this many: its full prompt blocks


class ChoiceRunner:
    def __init__(self, engine: LLMEngine, on_add: AddHook | None = None) -> None:
        self.engine = engine
        self.on_add = on_add  # called for each request added (worker metrics track it)
        self._waiting: dict[str, _Waiting] = {}

    @property
    def num_waiting(self) -> int:
        """Choices not in the engine yet: sequence slots already promised."""
        return sum(len(_not_added(w.job)) for w in self._waiting.values())

    def start(self, job: HeldJob, spec: JobSpec) -> None:
        """Add choice 0 (raises ValueError, TypeError or KeyError if the engine refuses it,
        and then nothing was added), and the others now or once it has computed the
        prompt's full blocks. All of them share the job's fair-share group and run on
        its adapter."""
        job.group, job.lora = spec.group, spec.lora
        prompt, params, priority = spec.prompt, spec.params, spec.priority
        self._add(job, 0, prompt, params, priority)
        bs = self.engine.config.block_size
        shared = (len(prompt) - 1) // bs * bs if self.engine.config.enable_prefix_caching else 0
        if len(job.choices) == 1:
            return
        if shared == 0:
            self._add_rest(job, prompt, params, priority)
        else:
            self._waiting[job.job_id] = _Waiting(job, prompt, params, priority, shared)

    def after_step(self, held: Held) -> list[HeldJob]:
        """After a step: a job with a failed choice has its other choices stopped; the
        waiting choices of a job are added once its choice 0 has computed the shared
        blocks or ended normally, and end (as aborted) if it ended otherwise. Returns
        the jobs whose choices changed here (one may be done now)."""
        changed = []
        for job in held.values():
            if not job.done and any(c.finish_reason == "error" for c in job.choices):
                self.abort(job)
                changed.append(job)
        for job_id, w in list(self._waiting.items()):
            job = w.job
            first = job.choices[0]
            request = self.engine.requests.get(first.request_id)
            if held.get(job_id) is not job:  # dropped (lease lost): nothing of it runs on
                del self._waiting[job_id]
            elif first.done and first.finish_reason not in NORMAL_END:
                del self._waiting[job_id]
                for c in _not_added(job):
                    c.end("abort")
                changed.append(job)
            elif first.done or (
                request is not None and request.num_computed_tokens >= w.shared_tokens
            ):
                del self._waiting[job_id]
                self._add_rest(job, w.prompt, w.params, w.priority)
                changed.append(job)
        return changed

    def abort(self, job: HeldJob) -> None:
        """Stop every choice: those in the engine finish as aborted with its next step,
        those not added yet end here."""
        self._waiting.pop(job.job_id, None)
        for c in job.choices:
            if c.added:
                self.engine.abort(c.request_id)
            elif not c.done:
                c.end("abort")

    def computed(self, job: HeldJob) -> bool:
        """The engine has computed some of the job (a choice is past its first step)."""
        for c in job.choices:
            if c.added:
                request = self.engine.requests.get(c.request_id)
                if request is None or request.num_computed_tokens > 0:
                    return True
        return False

    def _add_rest(
        self, job: HeldJob, prompt: list[int], params: SamplingParams, priority: Priority
    ) -> None:
        for c in job.choices[1:]:
            if c.added or c.done:
                continue
            try:
                self._add(job, c.index, prompt, params, priority)
            except (ValueError, TypeError, KeyError) as e:
                c.end("error", f"rejected by the worker: {e}")
                self.abort(job)
                return

    def _add(
        self, job: HeldJob, index: int, prompt: list[int], params: SamplingParams,
        priority: Priority,
    ) -> None:  # fmt: skip
        choice = job.choices[index]
        self.engine.add_request(
            choice.request_id, prompt, choice_params(params, index), priority, job.group,
            output_token_ids=choice.kept_tokens or None, lora=job.lora,
        )  # fmt: skip
        choice.added = True
        if self.on_add is not None:
            self.on_add(job, choice.request_id)


def _not_added(job: HeldJob) -> list[Choice]:
    return [c for c in job.choices if not c.added and not c.done]
