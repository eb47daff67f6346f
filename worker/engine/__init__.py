"""Continuous-batching engine: scheduler, paged KV block manager, model runner, sampler.

The torch-free parts (config, sampling_params, structured, outputs) import eagerly;
LLMEngine loads on first use, so the gateway can import ``worker.engine.structured`` and
``worker.engine.sampling_params`` to validate requests without pulling in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from worker.engine.config import EngineConfig
from worker.engine.outputs import RequestOutput
from worker.engine.sampling_params import Priority, SamplingParams
from worker.engine.structured import StructuredOutput

if TYPE_CHECKING:
    from worker.engine.llm_engine import LLMEngine

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
        return getattr(importlib.import_module("worker.engine.llm_engine"), name)
    raise AttributeError(f"module 'worker.engine' has no attribute {name!r}")
