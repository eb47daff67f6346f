"""One step's LoRA work: which slot each token row reads, applied after each projection."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tide_fleet.kernels.lora import LoraRows, add_lora, lora_rows
from tide_fleet.worker.lora.slots import LoraManager


class LoraStep:
    """The deltas of the adapters a step's rows run under, added to each projection's output
    in place (``kernels/lora.py``: per-adapter segments of rows, one low-rank pair each)."""

    def __init__(self, manager: LoraManager, rows: LoraRows) -> None:
        self.manager, self.rows = manager, rows

    @classmethod
    def build(
        cls, manager: LoraManager | None, row_slots: Sequence[int], device: torch.device
    ) -> LoraStep | None:
        """None when no row runs under an adapter (the step is the base model's)."""
        if manager is None:
            return None
        rows = lora_rows(list(row_slots), device)
        return None if rows is None else cls(manager, rows)

    def add(self, proj: str, layer: int, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        m = self.manager
        # The slots' shapes are fixed at start and the rows index them: no per-call checks.
        a, b = m.a[proj][layer], m.b[proj][layer]
        add_lora(y, x, a, b, m.geometry.subs[proj], self.rows, check=False)
        return y
