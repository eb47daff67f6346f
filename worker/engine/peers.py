"""What the model runner of rank 0 needs of the other ranks of a tensor-parallel worker."""

from __future__ import annotations

from typing import NoReturn, Protocol

from tide_fleet.worker.engine.scheduled import ScheduledRequest


class StepPeers(Protocol):
    def send_step(self, scheduled: list[ScheduledRequest]) -> None:
        """Hand every other rank the step rank 0 is about to run."""

    def step_done(self) -> None:
        """The step returned on rank 0 (the hang watchdog stops counting)."""

    def lost(self, reason: str) -> NoReturn:
        """The ranks can no longer run together: end them all, this process too."""
