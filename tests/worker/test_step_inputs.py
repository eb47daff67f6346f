"""The persistent step inputs: block-table rows written incrementally, rows reused, the
flattened inputs equal to a fresh build."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.worker.engine.scheduler import ScheduledRequest
from tide_fleet.worker.engine.step_inputs import StepBuilder, build_step_inputs

CPU = torch.device("cpu")


def builder(rows: int = 4, blocks: int = 8) -> StepBuilder:
    return StepBuilder(64, rows, blocks, 16, CPU, split_decodes=False)


def test_a_step_writes_only_the_blocks_a_request_gained():
    b = builder()
    table = [5, 9]
    b.build([ScheduledRequest("a", [1] * 20, 0, table, True)])
    row = b.tables._rows["a"][0]
    b.tables.view[row, 0] = 99  # had the row been rewritten, this would be 5 again
    table.append(3)  # the block manager appends to the same list
    b.build([ScheduledRequest("a", [7], 32, table, True)])
    assert b.tables.view[row, :3].tolist() == [99, 9, 3]


def test_a_preempted_request_gets_its_new_table_written_whole():
    b = builder()
    b.build([ScheduledRequest("a", [1] * 20, 0, [5, 9], True)])
    row = b.tables._rows["a"][0]
    b.build([ScheduledRequest("a", [1] * 20, 0, [2, 4], True)])  # freed, then new blocks
    assert b.tables._rows["a"][0] == row
    assert b.tables.view[row, :2].tolist() == [2, 4]


def test_rows_of_requests_no_longer_scheduled_are_reused():
    b = builder(rows=2)
    for i in range(5):  # five requests over time, two rows
        step = b.build(
            [ScheduledRequest(f"r{i}", [1], 16, [i, 10 + i], True),
             ScheduledRequest("long", [2], 16 + i, [7, 8], True)]
        )  # fmt: skip
        tables = step.meta.decode_groups[0].block_tables
        assert sorted(tables.tolist()) == sorted([[i, 10 + i], [7, 8]])
    assert len(b.tables._rows) == 2


def test_a_table_longer_than_the_rows_is_refused():
    b = builder(blocks=2)
    with pytest.raises(ValueError, match="holds 3 blocks; the table has room for 2"):
        b.build([ScheduledRequest("a", [1] * 40, 0, [1, 2, 3], True)])


def test_reused_buffers_give_what_a_fresh_build_gives():
    b = StepBuilder(64, 4, 8, 16, CPU, split_decodes=True)
    steps = [
        [ScheduledRequest("a", [3] * 20, 0, [4, 5], True),
         ScheduledRequest("b", [6], 40, [0, 1, 2], True)],
        [ScheduledRequest("a", [8], 20, [4, 5], True),
         ScheduledRequest("c", [1, 2, 3], 17, [6, 7], False),
         ScheduledRequest("b", [9], 41, [0, 1, 2], True)],
    ]  # fmt: skip
    for scheduled in steps:
        got, want = b.build(scheduled), build_step_inputs(scheduled, 16, CPU)
        for name in ("input_ids", "positions", "logits_rows"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert torch.equal(got.meta.slot_mapping, want.meta.slot_mapping)
        assert got.sampled_ids == want.sampled_ids
        for g, w in zip(got.meta.decode_groups, want.meta.decode_groups, strict=True):
            assert torch.equal(g.block_tables, w.block_tables) and g.rows == w.rows
            assert torch.equal(g.context_lens, w.context_lens)
        for g, w in zip(got.meta.prefills, want.meta.prefills, strict=True):
            assert torch.equal(g.block_table, w.block_table) and g.start_pos == w.start_pos


def test_the_varlen_pack_names_every_prefill_chunk():
    scheduled = [
        ScheduledRequest("d", [5], 30, [1, 2], True),
        ScheduledRequest("p", [1] * 20, 0, [3, 4], True),
        ScheduledRequest("q", [2] * 5, 17, [5, 6], True),
    ]
    batch = build_step_inputs(scheduled, 16, CPU, varlen=True).meta.prefill_batch
    assert batch is not None
    assert batch.first_row == 1 and batch.max_query_len == 20
    assert batch.query_start.tolist() == [0, 20, 25]
    assert batch.start_pos.tolist() == [0, 17]
    assert batch.block_tables.tolist() == [[3, 4], [5, 6]]


def test_a_reused_row_keeps_no_blocks_of_its_last_request():
    b = builder(rows=1)
    b.build([ScheduledRequest("a", [1] * 40, 0, [5, 6, 7], True)])
    b.build([ScheduledRequest("b", [1] * 20, 0, [2, 3], True)])  # takes a's row
    row = b.tables._rows["b"][0]
    assert b.tables.view[row, :4].tolist() == [2, 3, 0, 0]


def test_host_buffers_are_written_only_after_the_last_steps_copies_ran():
    # On CUDA a step's copies can still be queued when the next step is built (a prefill
    # chunk samples nothing, so nothing waited for the device): the builder waits for the
    # event it recorded after them before writing the host buffers again.
    b = builder()
    order: list[str] = []

    view = b.buffers.view["input_ids"]

    class Event:
        def synchronize(self) -> None:
            order.append(f"waited with input_ids[0] = {view[0]}")

    b.buffers.copies_done = Event()
    view[:] = -7
    b.build([ScheduledRequest("a", [3] * 5, 0, [1], True)])
    order.append(f"built with input_ids[0] = {view[0]}")
    assert order == ["waited with input_ids[0] = -7", "built with input_ids[0] = 3"]
    assert b.buffers.copies_done is None  # CPU: no copies to wait for next time
