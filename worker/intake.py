"""Taking messages from the queues: consume order, batch aging, wake-ups, one prefetched.

Messages are taken several per round trip (``tide_fleet.infra.wire.queues.Taker``: kombu's Redis
format without kombu's per-call cost), never more than the free slots. Interactive queues
come before batch ones, but batch work ages: after BATCH_EVERY interactive takes in a
row, batch queues go first once. After a poll finds every queue empty, the next poll
waits for a wake-up (every enqueue and re-queue publishes one) or EMPTY_RECHECK_SECONDS,
so a busy engine does not spend each step polling empty queues. A message taken that
cannot start yet waits here (at most one); the rest go back to the front of their queues.
A take prefers the jobs on the LoRA adapters the engine holds (``queues.ADAPTER_WINDOW``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence

import redis

from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.protocol import JobMessage, Keys

log = logging.getLogger("tide_fleet.worker.service")

BATCH_EVERY = 8  # at most this many interactive jobs taken in a row while batch work waits
EMPTY_RECHECK_SECONDS = 0.25
TAKE_AT_MOST = 16  # messages taken per round trip (never more than free slots)

Taken = tuple[queues.Delivery, JobMessage]


class Intake:
    def __init__(self, taker: queues.Taker, queue_names: list[str]) -> None:
        self.taker = taker
        self.queue_names = queue_names
        self.prefetched: Taken | None = None
        self.wakeups: redis.client.PubSub | None = None
        self._interactive_streak = 0
        self._queues_empty_at: float | None = None  # when a poll last found nothing

    def subscribe(self, client: redis.Redis) -> None:
        """(Re)subscribe to wake-ups on a connection that answers again."""
        with contextlib.suppress(Exception):  # the old connection is already broken
            if self.wakeups is not None:
                self.wakeups.close()
        self.wakeups = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8
        self.wakeups.subscribe(Keys.wakeup)
        self._queues_empty_at = None

    def wait_idle(self, timeout: float) -> None:
        """Sleep until the gateway announces a new job, or timeout seconds."""
        assert self.wakeups is not None
        if self.wakeups.get_message(timeout=timeout) is not None:
            self._queues_empty_at = None

    def next(self, free: int, adapters: Sequence[str] = ()) -> list[Taken]:
        """The prefetched message if there is one, else up to `free` new ones (none when
        there is no free slot or polling is not worth it yet); `adapters`: the LoRA adapters
        the engine holds, whose jobs a take prefers."""
        if self.prefetched is not None:
            taken, self.prefetched = [self.prefetched], None
            return taken
        if free <= 0 or not self._worth_polling():
            return []
        taken = self.poll(min(free, TAKE_AT_MOST), adapters)
        self._queues_empty_at = None if taken else time.monotonic()
        return taken

    def hold(self, taken: list[Taken], i: int) -> None:
        """taken[i] cannot start yet: it waits here; the ones after it go back."""
        self.prefetched = taken[i]
        self.taker.give_back([d for d, _ in taken[i + 1 :]])

    def release(self) -> None:
        """The prefetched message, if any, back to the front of its queue."""
        if self.prefetched is not None:
            message, _job = self.prefetched
            self.prefetched = None
            self.taker.give_back([message])

    def poll(self, limit: int, adapters: Sequence[str] = ()) -> list[Taken]:
        """Take up to `limit` messages in one round trip, in consume order."""
        order = self.queue_names
        aged = self._interactive_streak >= BATCH_EVERY
        if aged:
            order = sorted(order, key=lambda q: not q.endswith(".batch"))
            limit = 1
        else:  # never take past the point where batch work is due
            limit = min(limit, BATCH_EVERY - self._interactive_streak)
        taken = []
        for d in self.taker.take(order, limit, adapters):
            is_batch = d.queue.endswith(".batch")
            reset = is_batch or aged  # aged: batch work had its turn (or there was none)
            self._interactive_streak = 0 if reset else self._interactive_streak + 1
            try:
                taken.append((d, d.job()))
            except (ValueError, TypeError, KeyError) as e:
                log.error("dropping undecodable message on %s: %s", d.queue, e)
                self.taker.ack_now(d)
        return taken

    def _worth_polling(self) -> bool:
        """Poll again only after a wake-up, or EMPTY_RECHECK_SECONDS after an empty poll."""
        if self._queues_empty_at is None:
            return True
        assert self.wakeups is not None
        woken = False
        while self.wakeups.get_message(timeout=0) is not None:  # drain pending wake-ups
            woken = True
        if woken or time.monotonic() - self._queues_empty_at >= EMPTY_RECHECK_SECONDS:
            self._queues_empty_at = None
            return True
        return False
