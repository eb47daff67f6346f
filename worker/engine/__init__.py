"""Continuous-batching engine: scheduler, paged KV block manager, model runner, sampler.

The torch-free parts (config, sampling_params, structured, outputs) import eagerly;
LLMEngine loads on first use, so the gateway can import ``tide_fleet.worker.engine.structured`` and
``tide_fleet.worker.engine.sampling_params`` to validate requests without pulling in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.outputs import RequestOutput
from tide_fleet.worker.engine.sampling_params import Priority, SamplingParams
from tide_fleet.worker.engine.structured import StructuredOutput

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
