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
from dataclasses import dataclass, field
from typing import Any

import redis

from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.protocol import Keys


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
