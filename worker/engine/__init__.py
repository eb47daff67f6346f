"""Continuous-batching engine: scheduler, paged KV block manager, model runner, sampler."""

from worker.engine.config import EngineConfig
from worker.engine.llm_engine import LLMEngine, RequestOutput
from worker.engine.sampling_params import Priority, SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "Priority", "RequestOutput", "SamplingParams"]
