"""The planner's one error type."""

from __future__ import annotations


class PlanError(ValueError):
    """Input the planner cannot use, or a model that does not fit; the message says which."""
