"""Per-request generation parameters, validated when built."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Priority(enum.IntEnum):
    """Scheduling class: lower value is served first."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass
class SamplingParams:
    """What to generate. temperature 0 means greedy; top_k -1 or 0 disables top-k."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check_int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not isinstance(self.temperature, int | float) or isinstance(self.temperature, bool):
            raise ValueError(f"temperature must be a number, got {self.temperature!r}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not isinstance(self.top_p, int | float) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        _check_int("top_k", self.top_k)
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (disabled) or at least 1, got {self.top_k}")
        if self.seed is not None:
            _check_int("seed", self.seed)
            if not 0 <= self.seed < 2**63:
                raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings, got {s!r}")
        if self.stop_token_ids is not None:
            for t in self.stop_token_ids:
                _check_int("stop_token_ids", t)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
