"""Block tables of the running requests, one persistent row each, written incrementally.

A request's block table only grows while it holds its blocks (the block manager appends),
so a step writes just the blocks it gained since its last step; a preempted request gets
a new table list, noticed by identity, and its row is written whole. Rows of requests that
are no longer scheduled are reused when the table is full. The step builder
(``worker/engine/step_inputs.py``) gathers the rows of a step's requests on the device.
"""

from __future__ import annotations

import torch

from tide_fleet.worker.engine.scheduler import ScheduledRequest


def host_and_device(
    size: tuple[int, ...], dtype: torch.dtype, device: torch.device, mirror: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(host, device) buffers; on CPU one tensor unless mirror (tests of the copy path)."""
    pinned = device.type == "cuda"
    host = torch.zeros(size, dtype=dtype, pin_memory=pinned)
    if device.type == "cpu" and not mirror:
        return host, host
    return host, torch.zeros(size, dtype=dtype, device=device)


class BlockTables:
    """Block tables of the running requests, one persistent row each (int64, block 0 pads)."""

    def __init__(self, max_rows: int, max_blocks: int, device: torch.device, mirror: bool):
        self.max_blocks = max_blocks
        self.host, self.device = host_and_device((max_rows, max_blocks), torch.long, device, mirror)
        self.view = self.host.numpy()
        # request id -> (row, the block manager's table list, entries written)
        self._rows: dict[str, tuple[int, list[int], int]] = {}
        self._width: dict[int, int] = {}  # row -> entries written by its last occupant
        self._free = list(range(max_rows - 1, -1, -1))
        self._dirty = 0  # rows [0, _dirty) may differ from the device copy

    def row(self, s: ScheduledRequest, step_ids: set[str]) -> int:
        """The request's row, with any blocks it gained since it was last written."""
        table = s.block_table
        entry = self._rows.get(s.request_id)
        if entry is not None and entry[1] is table:
            row, _, written = entry
        else:  # new, or preempted and given a new table since: no stale tail left behind
            row, written = (entry[0] if entry is not None else self._take(step_ids)), 0
            self.view[row, len(table) : self._width.get(row, 0)] = 0
        if len(table) > self.max_blocks:
            raise ValueError(
                f"request {s.request_id} holds {len(table)} blocks; the table has room for "
                f"{self.max_blocks}"
            )
        if len(table) > written or written == 0:
            self.view[row, written : len(table)] = table[written:]
            self._dirty = max(self._dirty, row + 1)
        self._rows[s.request_id] = (row, table, len(table))
        self._width[row] = len(table)
        return row

    def _take(self, step_ids: set[str]) -> int:
        if not self._free:  # rows of requests that finished or wait: not in this step
            gone = [rid for rid in self._rows if rid not in step_ids]
            assert gone, "more requests in one step than block-table rows"
            for rid in gone:
                self._free.append(self._rows.pop(rid)[0])
        return self._free.pop()

    def upload(self) -> None:
        if self.device is not self.host and self._dirty:
            self.device[: self._dirty].copy_(self.host[: self._dirty], non_blocking=True)
        self._dirty = 0
