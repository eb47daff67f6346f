"""One model per batch file (OpenAI's rule): the model a batch's lines name, checked line by
line as the file is validated.

A line's ``body.model`` names a served model by its name or an alias, or a LoRA adapter
(declared with its model or loaded at run time: infra/jobs/targets.py); absent (or null),
the fleet's default. The first line that names one sets the batch's model; a later line
naming another one (after aliases are resolved; an adapter is a model of its own, not its
parent) is a file error, as is a name nothing goes by.
"""

from __future__ import annotations

from typing import Any

import redis

from tide_fleet.infra.jobs.targets import Target, find_target
from tide_fleet.infra.wire.models import ModelCatalog

SHOWN_CHARS = 80  # of a name a line gives, in an error message


class OneModel:
    """The batch's model so far (`model`, set by line `line`), and each line's check.
    `client`: where adapters loaded at run time are looked up (None: declared ones only)."""

    def __init__(self, models: ModelCatalog, client: redis.Redis | None = None) -> None:
        self.models = models
        self.client = client
        self.model: Target | None = None
        self.line = 0

    def check(self, n: int, requested: Any) -> tuple[str, str] | None:
        """(code, message) when line `n`'s ``body.model`` breaks the rule; None when it is
        the batch's model (the first such line sets it)."""
        if requested is not None and not isinstance(requested, str):
            return "invalid_model", f"body.model must be a served model's name, got {_r(requested)}"
        found = find_target(self.client, self.models, requested)
        if found is None:
            listed = ", ".join(repr(name) for name in self.models.names())
            return "model_not_found", (
                f"body.model {_r(requested)} is not served here; this fleet serves {listed}"
            )
        if self.model is None:
            self.model, self.line = found, n
        elif found.name != self.model.name:
            return "mismatched_model", (
                f"model {_shown(requested, found)} differs from the batch's model "
                f"{self.model.name!r} (line {self.line}); a batch file takes one model"
            )
        return None


def _shown(requested: str | None, found: Target) -> str:
    """The model as the line names it: 'name', 'alias' ('name'), or the default's name."""
    if requested is None:
        return f"{found.name!r} (the default: no body.model)"
    return repr(requested) if requested == found.name else f"{_r(requested)} ({found.name!r})"


def _r(value: Any) -> str:
    """repr(value), cut to SHOWN_CHARS: a line may give a name of any length."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."
