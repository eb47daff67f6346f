"""Per-request generation parameters, validated when built."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from tide_fleet.infra.contract.structured import StructuredOutput, as_structured


class Priority(enum.IntEnum):
    """Scheduling class: lower value is served first."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass
class SamplingParams:
    """What to generate. Names and ranges follow OpenAI's API where it has the option.

    temperature: 0 means greedy. top_k: -1 or 0 disables it.
    seed: per request; its draws do not depend on what else is in the batch.

    Options applied to the logits, in this order, only on rows that set them (a row
    without any costs nothing, and greedy stays token-exact):
    logit_bias: {token id: bias in [-100, 100]} added to the logits (OpenAI). JSON keys
        may be strings ("50"); they become ints. -100 in effect bans a token, 100 forces it.
    min_tokens: stop tokens (EOS and stop_token_ids) are masked, and stop strings not
        looked for, until this many tokens are out (vLLM). A structured output that is
        complete still ends the request.
    repetition_penalty: > 0, 1 = off (HF/vLLM): a logit of any token already in the
        prompt or the output is divided by it when positive, multiplied when negative.
    frequency_penalty, presence_penalty: in [-2, 2], 0 = off (OpenAI): over generated
        tokens, logit -= count * frequency_penalty + (count > 0) * presence_penalty.
    structured: the output must match a JSON schema, any JSON object, a regex, one of a
        list of strings, or a grammar (``StructuredOutput``, or its dict form). Disallowed
        tokens are masked last; EOS is allowed only where the grammar may end, and the
        request finishes ("stop") as soon as the grammar is complete. max_tokens and stop
        strings still apply and can cut the output short (finish_reason "length"/"stop"),
        as with OpenAI. The spec's shape is checked here; its grammar by
        ``structured.validate`` (the gateway) and again when the engine compiles it.

    logprobs: None = off; 0..20 = return each sampled token's logprob and that many top
        alternatives (OpenAI chat's top_logprobs, completions' logprobs). They are the raw
        model distribution, log_softmax of the logits before bias, penalties, grammar
        mask or temperature (vLLM's default), so the chosen token's logprob can be that
        of a token the model alone would rarely pick.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_tokens: int = 0
    logprobs: int | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self._check_options()
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

    def _check_options(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _check_number("repetition_penalty", self.repetition_penalty)
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(
                f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}"
            )
        if self.logit_bias is not None:
            self.logit_bias = _logit_bias(self.logit_bias)
        _check_int("min_tokens", self.min_tokens)
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be at least 0, got {self.min_tokens}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs)
            if not 0 <= self.logprobs <= 20:
                raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")
        if self.structured is not None:
            self.structured = as_structured(self.structured)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    @property
    def needs_logits_processing(self) -> bool:
        """True when any option changes this row's logits before sampling."""
        return (
            self.has_penalties
            or bool(self.logit_bias)
            or self.min_tokens > 0
            or self.structured is not None
        )


def _check_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _check_number(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")


def _logit_bias(bias: Any) -> dict[int, float]:
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a mapping of token id to bias, got {bias!r}")
    out: dict[int, float] = {}
    for key, value in bias.items():
        token = int(key) if isinstance(key, str) and key.isdigit() else key
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {key!r}")
        _check_number("logit_bias values", value)
        if not -100.0 <= value <= 100.0:
            raise ValueError(f"logit_bias values must be in [-100, 100], got {value}")
        out[token] = float(value)
    return out
