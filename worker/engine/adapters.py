"""The engine's LoRA adapter methods: register and unregister adapters by name, and what
its device slots hold (the slots themselves: worker/lora/slots.py)."""

from __future__ import annotations

from typing import Any

from tide_fleet.infra.contract.adapters import AdapterSpec
from tide_fleet.infra.contract.registry import adapter_cache_dir
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.request import Request
from tide_fleet.worker.lora.slots import Adapters, BaseOnly, LoraManager
from tide_fleet.worker.models.llama import LlamaModel


def lora_slots(model: LlamaModel, config: EngineConfig) -> Adapters:
    """The engine's adapter slots (``max_loras`` of them), or none."""
    if not config.max_loras:
        return BaseOnly()
    return LoraManager(
        model.config, model.dtype, model.device, config.max_loras, config.max_cpu_loras,
        config.max_lora_rank, adapter_cache_dir(),
    )  # fmt: skip


class EngineAdapters:
    """LLMEngine's adapter methods (it sets ``loras`` and ``requests``)."""

    loras: Adapters
    requests: dict[str, Request]

    def register_adapter(self, name: str, path: str) -> AdapterSpec:
        """Serve the PEFT adapter at `path` (a folder or s3:// prefix) as `name`; the same
        name and path again is a no-op. AdapterError names what does not fit."""
        if not isinstance(self.loras, LoraManager):
            raise ValueError(f"adapter {name!r}: this engine serves no adapters (max_loras 0)")
        return self.loras.register(name, path)

    def unregister_adapter(self, name: str) -> bool:
        """Stop serving an adapter; ValueError while requests under it are unfinished."""
        if not isinstance(self.loras, LoraManager):
            return False
        users = sum(r.lora == name for r in self.requests.values())
        if users:
            raise ValueError(f"adapter {name!r} has {users} unfinished requests")
        return self.loras.unregister(name)

    def adapters_on_device(self) -> list[str]:
        return self.loras.on_device()

    def adapter_stats(self) -> dict[str, Any]:
        """``{"lora": ...}`` where the engine has slots (``stats()`` merges it)."""
        return {"lora": self.loras.stats()} if isinstance(self.loras, LoraManager) else {}
