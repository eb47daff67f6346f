"""Block pool, LRU free list and prefix-cache confirmation."""

from __future__ import annotations

import pytest

from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.worker.engine.block_manager import BlockManager, FreeBlockQueue, hash_block
from tide_fleet.worker.engine.request import Request


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def _run_prefill(bm: BlockManager, r: Request) -> list:
    hits = bm.get_computed_blocks(r)
    assert bm.allocate_slots(r, r.num_tokens - len(hits) * bm.block_size, hits)
    r.num_computed_tokens = r.num_tokens
    bm.cache_full_blocks(r)
    return hits


def test_free_queue_removes_from_the_middle():
    bm = BlockManager(4, 4)
    q = FreeBlockQueue(bm.blocks)
    q.remove(bm.blocks[2])
    assert q.ids() == [0, 1, 3] and len(q) == 3
    q.appendleft(bm.blocks[2])
    assert q.popleft().block_id == 2


def test_shared_prefix_is_reused_and_ref_counted():
    bm = BlockManager(10, 4)
    a = _req("a", list(range(10)))  # blocks: [0..3] [4..7] [8,9]
    assert _run_prefill(bm, a) == []
    b = _req("b", [*range(8), 99, 98, 97])
    hits = _run_prefill(bm, b)
    assert [h.block_id for h in hits] == bm.get_block_table("a")[:2]
    assert all(bm.blocks[i].ref_count == 2 for i in bm.get_block_table("a")[:2])
    bm.free(a)
    bm.free(b)
    bm.assert_all_free()
    assert len(bm.cached) == 2  # cached-free, evicted only when needed
    c = _req("c", [*range(8), 5])
    assert len(_run_prefill(bm, c)) == 2


def test_eviction_takes_unhashed_blocks_first_then_lru():
    bm = BlockManager(5, 2)
    a = _req("a", [1, 2, 3, 4, 5])  # 2 full blocks cached + 1 partial
    _run_prefill(bm, a)
    bm.free(a)
    assert len(bm.cached) == 2
    b = _req("b", [9])
    _run_prefill(bm, b)  # takes a block with no cached content: a's prefix survives
    assert len(bm.lookup_prefix([1, 2, 3, 4, 5])) == 2
    c = _req("c", [7, 7, 8, 8, 6])  # needs 3 blocks: one must be evicted
    _run_prefill(bm, c)
    # a's blocks were freed tail first, so its second block is evicted before its first.
    assert len(bm.lookup_prefix([1, 2, 3, 4, 5])) == 1


def test_hash_collision_never_serves_wrong_tokens():
    bm = BlockManager(8, 2)
    a = _req("a", [1, 2, 3])
    _run_prefill(bm, a)
    block = bm.blocks[bm.get_block_table("a")[0]]
    # Pretend another chunk hashes to the same value: the token check must refuse it.
    forged = hash_block(0, (7, 7))
    bm.cached[forged] = block
    block.block_hash = forged
    assert bm.lookup_prefix([7, 7, 7]) == []


def test_allocation_failure_changes_nothing():
    bm = BlockManager(2, 4)
    r = _req("r", list(range(12)))
    assert not bm.allocate_slots(r, 12)
    assert bm.num_free_blocks == 2 and "r" not in bm.block_tables
    bm.check_invariants()


def test_invariant_check_catches_a_leak():
    bm = BlockManager(4, 4)
    r = _req("r", [1, 2, 3])
    bm.allocate_slots(r, 3)
    with pytest.raises(AssertionError):
        bm.assert_all_free()


def test_an_adapters_prefix_never_serves_another_adapter_or_the_base():
    """A request's cache_salt (its LoRA adapter) roots its hash chain: the same tokens
    under another adapter, or the base, are a miss; under the same adapter, a hit."""
    bm = BlockManager(16, 4)
    base = _req("base", list(range(10)))
    _run_prefill(bm, base)
    under_a = _req("a1", list(range(10)))
    under_a.cache_salt = 7
    assert _run_prefill(bm, under_a) == []
    again_a = _req("a2", list(range(10)))
    again_a.cache_salt = 7
    assert [h.block_id for h in _run_prefill(bm, again_a)] == bm.get_block_table("a1")[:2]
    under_b = _req("b1", list(range(10)))
    under_b.cache_salt = 8
    assert _run_prefill(bm, under_b) == []
    assert bm.lookup_prefix(list(range(10)), record=False, salt=7)
    assert bm.lookup_prefix(list(range(10)), record=False, salt=9) == []
    bm.check_invariants()
