"""Resuming a job an earlier attempt left unfinished: what it already produced, per choice.

A job whose worker died, drained or lost its lease is taken again from the queue. What
the earlier attempts wrote is on the job's event stream (``Keys.events``): each delta names
its choice (``i``), carries its token ids (``t``) and, when the job asked, their logprob
entries (``lp``). Deltas are written only by the lease holder (``JobStore.add_delta``), so
the stream holds one continuous output per choice. A new attempt reads it and starts each
choice from its prompt plus those tokens (``LLMEngine.add_request(output_token_ids=)``):
their prefill hits the prefix cache where it can, and generation goes on where it stopped,
so the stream goes on without a repeat or a gap, and the result counts each token once.
A stream with a delta lacking token ids (written by an older worker) is not resumed.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.protocol import Keys
from tide_fleet.worker.held import HeldJob

log = logging.getLogger("tide_fleet.worker.service")


@dataclass
class Kept:
    """One choice's output so far: its tokens and, when asked, their logprob entries."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


def may_have_output(record: dict[str, str]) -> bool:
    """Whether an earlier attempt may have written output (else the stream is not read)."""
    return bool(
        record.get("first_token_at")
        or int(record.get("attempts") or 0) > 0
        or int(record.get("lost_unstarted") or 0) > 0
    )


def read_kept(client: redis.Redis, job_id: str) -> dict[int, Kept]:
    """Choice index -> what earlier attempts produced for it; {} when there is nothing to
    resume from."""
    kept: dict[int, Kept] = {}
    for _, raw in client.xrange(Keys.events(job_id)):
        event = decode_hash(raw)
        if event.get("type") != "delta":
            continue
        if "t" not in event:
            return {}
        choice = kept.setdefault(int(event.get("i") or 0), Kept())
        if event["t"]:
            choice.tokens += [int(t) for t in event["t"].split(",")]
        if event.get("lp"):
            choice.logprobs += json.loads(event["lp"])
    return kept


def resume(client: redis.Redis, held: HeldJob, record: dict[str, str]) -> None:
    """Start `held`'s choices from what earlier attempts wrote; its record's other fields
    (prompt, sampling, adapter) are the job's as ever, so it resumes as it began."""
    kept = read_kept(client, held.job_id)
    for c in held.choices:
        if (k := kept.get(c.index)) is not None:
            c.kept_tokens, c.kept_logprobs = k.tokens, k.logprobs
    if resumed := sum(len(c.kept_tokens) for c in held.choices):
        held.first_token_at = float(record.get("first_token_at") or time.time())
        client.incrby(Keys.resumed_tokens, resumed)
        log.info("resuming %s from %s kept tokens", held.job_id,
                 [len(c.kept_tokens) for c in held.choices])  # fmt: skip
