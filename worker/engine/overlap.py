"""The overlapped engine loop: step n+1 is scheduled, built and launched while step n's
sampled tokens are still on the device; the host reads them one step behind.

A request sampled in a step the host has not read has ``pending`` 1: the scheduler counts
that token (``Request.num_sampled_tokens``) and schedules it as ``PLACEHOLDER``, whose
input id the model runner copies on the device from the step that sampled it (``Feed``).
Stop conditions, text and outputs come one step late; a request that ended in step n was
also run in step n+1, and that row's token is dropped. Greedy and seeded tokens are those
of the serial loop. Steps whose requests need the host between steps (logprobs, logits
processing, structured outputs) run serially; a tensor-parallel engine always does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tide_fleet.worker.engine.outputs import StepStats
from tide_fleet.worker.engine.request import Request
from tide_fleet.worker.engine.scheduled import PLACEHOLDER, ScheduledRequest


def overlappable(request: Request) -> bool:
    """Whether the request's sampling needs nothing from the host between steps."""
    p = request.params
    return p.logprobs is None and not p.needs_logits_processing and p.structured is None


@dataclass
class Feed:
    """A launched step's sampled ids on the device, by the request id of each row."""

    tokens: torch.Tensor
    rows: dict[str, int]


@dataclass
class InFlight:
    """A step launched and sampled whose tokens the host has not read.

    On CUDA the tokens start their copy to pinned host memory as soon as they are sampled,
    behind an event: reading them waits for that copy alone, not for the step launched
    after (a plain ``.tolist()`` would wait for the whole stream)."""

    tokens: torch.Tensor  # [rows] on the device
    failed: torch.Tensor | None  # [rows] nonzero where a random row had no token to sample
    requests: list[Request]  # the sampled rows' requests, in row order
    stats: StepStats
    _host: torch.Tensor | None = None
    _ready: torch.cuda.Event | None = None

    def __post_init__(self) -> None:
        if self.tokens.device.type == "cuda":
            self._host = self._both().to("cpu", non_blocking=True)  # into pinned memory
            self._ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._ready.record()

    def feed(self) -> Feed:
        return Feed(self.tokens, {r.request_id: i for i, r in enumerate(self.requests)})

    def read(self) -> list[tuple[Request, int, bool]]:
        """(request, token, failed) per row: the one host read of this step."""
        if self._ready is not None and self._host is not None:
            self._ready.synchronize()
            values = self._host.tolist()
        else:
            values = self._both().tolist()
        tokens, failed = values if self.failed is not None else (values, [0] * len(values))
        return list(zip(self.requests, tokens, map(bool, failed), strict=True))

    def _both(self) -> torch.Tensor:
        """The tokens, with the failed flags stacked under them where there are any."""
        if self.failed is None:
            return self.tokens
        return torch.stack([self.tokens, self.failed.long()])


def apply_feed(input_ids: torch.Tensor, order: list[ScheduledRequest], feed: Feed | None) -> None:
    """Copy, on the device, each PLACEHOLDER input of the step (rows in ``order``) from the
    step that sampled it. A pending token is always its request's last input, and only the
    overlapped loop makes them (no feed: nothing to look for)."""
    if feed is None:
        return
    dst, src, at = [], [], 0
    for s in order:
        at += s.num_tokens
        if s.token_ids[-1] == PLACEHOLDER:
            if s.request_id not in feed.rows:
                raise RuntimeError(f"request {s.request_id}: a pending token with no step")
            dst.append(at - 1)
            src.append(feed.rows[s.request_id])
    if not dst:
        return
    index = torch.tensor([dst, src], dtype=torch.long)
    if input_ids.device.type == "cuda":  # pinned, so the copy does not wait for the stream
        index = index.pin_memory().to(input_ids.device, non_blocking=True)
    input_ids.index_copy_(0, index[0], feed.tokens.index_select(0, index[1]))
