"""Continuous-batching engine: scheduler, paged KV block manager, model runner, sampler.

The torch-free parts (config, outputs, and the request contract's sampling parameters and
structured-output specs, which live in ``infra.contract``) import eagerly; LLMEngine loads
on first use, so importing this package does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tide_fleet.infra.contract.sampling_params import Priority, SamplingParams
from tide_fleet.infra.contract.structured import StructuredOutput
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.outputs import RequestOutput

if TYPE_CHECKING:
    from tide_fleet.worker.engine.llm_engine import LLMEngine

__all__ = [
    "EngineConfig",
    "LLMEngine",
    "Priority",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutput",
]


def __getattr__(name: str) -> Any:
    if name == "LLMEngine":
        return getattr(importlib.import_module("tide_fleet.worker.engine.llm_engine"), name)
    raise AttributeError(f"module 'tide_fleet.worker.engine' has no attribute {name!r}")
