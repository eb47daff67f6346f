"""The batched LoRA delta: one step's token rows, each on its own adapter (or none), added to a
projection's output in place, on the implementation kernels/dispatch.py names for op ``lora``.

Adapters sit in fixed slots, stacked per projection:

- ``a``: ``[num_slots, n_sub * R, in_features]``; sub-module i's A is rank block i, rows
  ``[i*R, (i+1)*R)``, zero-padded past the module's own rank (R: the largest rank served).
- ``b``: ``[num_slots, out_features, R]``, the adapter's scaling folded in, zero-padded columns.
- ``subs``: one ``(lo, hi)`` output column range per sub-module (a fused q|k|v projection has
  three, o_proj one); columns ``[lo, hi)`` take rank block i.

A row r on slot s = ``slot_ids[r]`` gets, for every sub-module i,
``y[r, lo:hi] += (x[r] @ a[s, i*R:(i+1)*R].T) @ b[s, lo:hi].T``; slot -1 is a base row and
gets nothing. ``lora_rows`` groups the step's rows by slot once (``LoraRows``); every LoRA
projection of every layer of the step then reuses it.

Implementations: ``cpp`` (kernels/csrc/lora/lora.cpp: a pass per row in float, rows in
parallel; it reads ``b`` stored rank-major, ``[num_slots, R, out_features]``, given as its
transposed view, and hands any other ``b`` to torch), ``torch`` (the adapters' rows as the
batch entries of one shrink and one expand per sub-module) and ``triton``
(kernels/triton_lora.py: a segmented shrink and expand, one segment per adapter of the step;
CUDA, or CPU under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise

import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import dispatch


@dataclass(frozen=True)
class LoraRows:
    """The step's rows with an adapter, grouped by slot: one segment per distinct slot, in slot
    order, rows in their step order within it.

    ``order``, ``seg_start``, ``seg_len`` and ``seg_slot`` are views of one int64 device tensor;
    ``segments`` pairs each slot (on the host) with its slice of ``order``.
    """

    order: torch.Tensor  # [num_lora_rows]: row indices, segment after segment
    seg_start: torch.Tensor  # [num_segments]: where each segment begins in order
    seg_len: torch.Tensor  # [num_segments]
    seg_slot: torch.Tensor  # [num_segments]
    segments: tuple[tuple[int, torch.Tensor], ...]  # (slot, its rows: a view of order)
    num_rows: int  # len(slot_ids): rows of x and y past it are padding, left alone
    max_seg_len: int
    # The torch path's padded grid [num_segments, max_seg_len]: where each entry of order
    # sits in it (None: every segment is max_seg_len long, the grid is order itself).
    dest: torch.Tensor | None = None
    # The slots are first..last with none missing: the stacks are read as a view.
    slot_span: tuple[int, int] | None = None

    @property
    def num_lora_rows(self) -> int:
        return self.order.shape[0]


def lora_rows(
    slot_ids: torch.Tensor | Sequence[int], device: torch.device | str
) -> LoraRows | None:
    """The step's rows grouped by adapter slot (-1: a base row), or None where no row has one.

    Built on the host and uploaded in one copy. A tensor of slot ids is read back first (a
    device sync where it lives on a GPU): pass the host list where there is one.
    """
    ids = slot_ids.tolist() if isinstance(slot_ids, torch.Tensor) else list(slot_ids)
    groups: dict[int, list[int]] = {}
    for row, slot in enumerate(ids):
        if slot < -1:
            raise ValueError(f"lora slot ids are -1 (no adapter) or a slot >= 0, got {slot}")
        if slot >= 0:
            groups.setdefault(slot, []).append(row)
    if not groups:
        return None
    slots = sorted(groups)
    lengths = [len(groups[s]) for s in slots]
    starts = [0, *accumulate(lengths)][:-1]
    order = [row for s in slots for row in groups[s]]
    # Each part starts on a 16-byte boundary: Triton specialises a kernel on its pointers'
    # alignment, so a part's offset must not depend on the step's row count.
    longest = max(lengths)
    dest = [] if min(lengths) == longest else [
        j * longest + k for j, n in enumerate(lengths) for k in range(n)]  # fmt: skip
    flat: list[int] = []
    offsets = []
    for part in (order, starts, lengths, slots, dest):
        offsets.append(len(flat))
        flat += part + [0] * (len(part) % 2)
    packed = torch.tensor(flat, dtype=torch.int64, device=device)
    sizes = (len(order), *[len(slots)] * 3, len(dest))
    order_t, seg_start, seg_len, seg_slot, dest_t = (
        packed[o : o + n] for o, n in zip(offsets, sizes, strict=True)
    )
    return LoraRows(
        order=order_t,
        seg_start=seg_start,
        seg_len=seg_len,
        seg_slot=seg_slot,
        segments=tuple(
            (s, order_t[b : b + n]) for s, b, n in zip(slots, starts, lengths, strict=True)
        ),
        num_rows=len(ids),
        max_seg_len=longest,
        dest=dest_t if dest else None,
        slot_span=(slots[0], slots[-1] + 1) if slots[-1] - slots[0] == len(slots) - 1 else None,
    )


def add_lora(
    y: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    subs: Sequence[tuple[int, int]],
    rows: LoraRows,
    check: bool = True,
) -> None:
    """Add each row's adapter delta to y in place (module docstring: the shapes).

    y: ``[n, out_features]``, x: ``[n, in_features]``, n at least ``rows.num_rows``; rows
    without an adapter and padding rows past ``rows.num_rows`` are left as they are.
    ``check=False`` skips the shape checks: for a caller whose stacks were checked once
    (the engine's slots, every projection of every step).
    """
    if check:
        _check(y, x, a, b, subs, rows)
    impl = dispatch.impl("lora", y.device)
    if impl == "cpp" and b.stride(1) == 1 and (ops := cpu_kernels.ops()) is not None:
        ops.lora_add_(
            y, x, a, b, [lo for lo, _ in subs], [hi for _, hi in subs], rows.order,
            rows.seg_start, rows.seg_len, rows.seg_slot,
        )  # fmt: skip
        return
    if impl == "triton":
        # Here, not at the top: Triton is optional (a dev extra; CPU-only installs lack it).
        from tide_fleet.kernels import triton_lora

        triton_lora.add_lora(
            y, x, a, b, subs, rows.order, rows.seg_start, rows.seg_len, rows.seg_slot,
            rows.max_seg_len,
        )  # fmt: skip
        return
    _torch_add(y, x, a, b, subs, rows)


def _torch_add(
    y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    subs: Sequence[tuple[int, int]], rows: LoraRows,
) -> None:  # fmt: skip
    """The torch path: the rows of each adapter as one batch entry of a [segments,
    longest segment] grid (zero rows pad the shorter segments), so a projection takes a
    handful of ops however many adapters the step mixes: gather, one batched shrink, a
    batched expand per sub-module, one scatter-add."""
    num_seg, longest, rank = len(rows.segments), rows.max_seg_len, b.shape[2]
    xs = x.index_select(0, rows.order)
    if rows.dest is not None:
        grid = x.new_zeros(num_seg * longest, x.shape[1])
        xs = grid.index_copy_(0, rows.dest, xs)
    if rows.slot_span is not None:
        a_seg, b_seg = (
            a[rows.slot_span[0] : rows.slot_span[1]],
            b[rows.slot_span[0] : rows.slot_span[1]],
        )
    else:
        a_seg, b_seg = a.index_select(0, rows.seg_slot), b.index_select(0, rows.seg_slot)
    # Transposed products ([seg, rank, len], [seg, out, len]): the stacked weights are
    # read as they lie (no copy of them per call); the rows are small to transpose.
    t = torch.bmm(a_seg, xs.view(num_seg, longest, -1).transpose(1, 2))  # [seg, n_sub*R, len]
    parts = [
        torch.bmm(b_seg[:, lo:hi], t[:, i * rank : (i + 1) * rank])  # [seg, hi - lo, len]
        for i, (lo, hi) in enumerate(subs)
    ]
    delta_t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    delta = delta_t.transpose(1, 2).reshape(num_seg * longest, -1)
    if rows.dest is not None:
        delta = delta.index_select(0, rows.dest)
    if all(p[1] == q[0] for p, q in pairwise(subs)):  # one run of columns: one scatter-add
        y[:, subs[0][0] : subs[-1][1]].index_add_(0, rows.order, delta.to(y.dtype))
        return
    widths = [hi - lo for lo, hi in subs]
    for (lo, hi), part in zip(subs, delta.split(widths, dim=1), strict=True):
        y[:, lo:hi].index_add_(0, rows.order, part.to(y.dtype))


def _check(
    y: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    subs: Sequence[tuple[int, int]],
    rows: LoraRows,
) -> None:
    """A ValueError for shapes that do not fit together: a kernel would read out of bounds."""
    num_slots, ranks, in_features = a.shape
    if b.shape[0] != num_slots or ranks != len(subs) * b.shape[2]:
        raise ValueError(
            f"lora: a {tuple(a.shape)} and b {tuple(b.shape)} do not make {len(subs)} "
            "rank blocks of b's R over the same slots"
        )
    if x.shape[1] != in_features or y.shape[1] != b.shape[1]:
        raise ValueError(
            f"lora: x {tuple(x.shape)} and y {tuple(y.shape)} do not fit a {tuple(a.shape)} "
            f"and b {tuple(b.shape)}"
        )
    if min(x.shape[0], y.shape[0]) < rows.num_rows:
        raise ValueError(f"lora: x and y need at least {rows.num_rows} rows")
    if x.dtype != a.dtype or b.dtype != a.dtype:
        raise ValueError(f"lora: x {x.dtype}, a {a.dtype} and b {b.dtype} differ")
    ranges = sorted(subs)
    overlap = any(prev[1] > nxt[0] for prev, nxt in pairwise(ranges))
    if overlap or any(not 0 <= lo <= hi <= y.shape[1] for lo, hi in subs):
        raise ValueError(
            f"lora: sub-module columns {list(subs)} overlap or leave 0..{y.shape[1]}"
        )  # the Triton expand adds each column once, from one program
    if rows.segments[-1][0] >= num_slots:
        raise ValueError(f"lora: slot {rows.segments[-1][0]} of {num_slots} slots")
