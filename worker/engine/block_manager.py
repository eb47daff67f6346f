"""Paged KV block pool with reference counts and a hash-chained prefix cache.

Pure Python (no torch): the model runner owns the tensors, this module only decides
which block ids each request's tokens live in.

Free blocks sit in one LRU list threaded through the blocks themselves, so a cached
block that is hit again is taken out of the middle in O(1). Blocks with no cached
content are freed to the head (reused first); cached ones to the tail (evicted last).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import xxhash

from tide_fleet.worker.engine.request import Request

_NO_PARENT = 0


class Block:
    __slots__ = ("block_hash", "block_id", "next", "parent", "prev", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None
        # Confirmation data for a prefix hit: the exact tokens and the parent block
        # (id, hash) they were computed after. A hash collision can never serve wrong KV.
        self.token_ids: tuple[int, ...] = ()
        self.parent: tuple[int, int] | None = None
        self.prev: Block | None = None
        self.next: Block | None = None


class FreeBlockQueue:
    """Doubly linked list of free blocks with O(1) push, pop and removal."""

    def __init__(self, blocks: Iterable[Block]) -> None:
        self._head = Block(-1)
        self._tail = Block(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free

    def popleft(self) -> Block:
        block = self._head.next
        if block is None or block is self._tail:
            raise IndexError("no free blocks")
        self.remove(block)
        return block

    def append(self, block: Block) -> None:
        self._insert_after(block, self._tail.prev)

    def appendleft(self, block: Block) -> None:
        self._insert_after(block, self._head)

    def remove(self, block: Block) -> None:
        assert block.prev is not None and block.next is not None, "block is not in the free list"
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_free -= 1

    def _insert_after(self, block: Block, anchor: Block | None) -> None:
        assert anchor is not None and anchor.next is not None
        block.prev, block.next = anchor, anchor.next
        anchor.next.prev = block
        anchor.next = block
        self.num_free += 1

    def ids(self) -> list[int]:
        out, node = [], self._head.next
        while node is not None and node is not self._tail:
            out.append(node.block_id)
            node = node.next
        return out


def hash_block(parent_hash: int, token_ids: Sequence[int]) -> int:
    """Chain hash: the parent block's hash and this block's token ids."""
    data = parent_hash.to_bytes(8, "little") + array("q", token_ids).tobytes()
    return xxhash.xxh3_64_intdigest(data)


class BlockManager:
    """Allocates KV blocks to requests; shares full prompt blocks through the prefix cache."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, Block] = {}
        self.block_tables: dict[str, list[int]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request, record: bool = True) -> list[Block]:
        """Longest run of cached full blocks matching the request's leading tokens.

        The last token is never served from cache (it must be recomputed to sample).
        """
        return self.lookup_prefix(request.all_token_ids, record=record, salt=request.cache_salt)

    def lookup_prefix(
        self, token_ids: Sequence[int], record: bool = True, salt: int = _NO_PARENT
    ) -> list[Block]:
        """``salt`` roots the chain: a request's LoRA adapter (0 for the base), so KV
        computed under one adapter never serves another."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[Block] = []
        parent_hash, parent_id = salt, -1
        for start in range(0, (len(token_ids) - 1) // bs * bs, bs):
            chunk = tuple(token_ids[start : start + bs])
            block_hash = hash_block(parent_hash, chunk)
            block = self.cached.get(block_hash)
            if block is None or block.token_ids != chunk:
                break
            if block.parent != (parent_id, parent_hash):
                break
            hits.append(block)
            parent_hash, parent_id = block_hash, block.block_id
        if record:
            self.prefix_queries += len(token_ids)
            self.prefix_hits += len(hits) * bs
        return hits

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed_blocks: Sequence[Block] = ()
    ) -> bool:
        """Give the request blocks for num_new_tokens more tokens after its computed ones.

        computed_blocks are prefix-cache hits for a request that holds no blocks yet.
        Returns False, changing nothing, when the pool is short.
        """
        table = self.block_tables.setdefault(request.request_id, [])
        num_total = request.num_computed_tokens + len(computed_blocks) * self.block_size
        num_needed = self.blocks_for(num_total + num_new_tokens) - len(table) - len(computed_blocks)
        num_revived = sum(1 for b in computed_blocks if b.ref_count == 0)
        if max(num_needed, 0) + num_revived > self.num_free_blocks:
            if not table:
                del self.block_tables[request.request_id]
            return False
        for block in computed_blocks:
            if block.ref_count == 0:
                self.free_queue.remove(block)
            block.ref_count += 1
            table.append(block.block_id)
        if computed_blocks:
            self._num_cached_blocks[request.request_id] = len(computed_blocks)
        for _ in range(num_needed):
            table.append(self._take_free_block().block_id)
        return True

    def _take_free_block(self) -> Block:
        block = self.free_queue.popleft()
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash, block.token_ids, block.parent = None, (), None
        block.ref_count = 1
        return block

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's blocks whose tokens all have KV computed."""
        if not self.enable_prefix_caching:
            return
        table = self.block_tables.get(request.request_id)
        if not table:
            return
        bs = self.block_size
        # (a token computed as input before the host has read it is not hashed yet)
        num_full = min(min(request.num_computed_tokens, request.num_tokens) // bs, len(table))
        done = self._num_cached_blocks.get(request.request_id, 0)
        if done >= num_full:
            return
        tokens = request.all_token_ids
        if done:
            parent = self.blocks[table[done - 1]]
            assert parent.block_hash is not None
            parent_hash, parent_id = parent.block_hash, parent.block_id
        else:
            parent_hash, parent_id = request.cache_salt, -1
        for i in range(done, num_full):
            block = self.blocks[table[i]]
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            block_hash = hash_block(parent_hash, chunk)
            if block.block_hash is None:
                block.block_hash, block.token_ids = block_hash, chunk
                block.parent = (parent_id, parent_hash)
                self.cached.setdefault(block_hash, block)
            parent_hash, parent_id = block_hash, block.block_id
        self._num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Release every block of the request (finish, abort or preemption)."""
        table = self.block_tables.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        for block_id in reversed(table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is not None and self.cached.get(block.block_hash) is block:
                    self.free_queue.append(block)
                else:
                    block.block_hash, block.token_ids, block.parent = None, (), None
                    self.free_queue.appendleft(block)

    def stats(self) -> dict[str, float]:
        return {"num_blocks": self.num_blocks, "num_free_blocks": self.num_free_blocks,
                "kv_cache_usage": self.usage, "prefix_cache_queries": self.prefix_queries,
                "prefix_cache_hits": self.prefix_hits}  # fmt: skip

    def get_block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def check_invariants(self) -> None:
        """Raise AssertionError if ref counts, tables, free list or cache disagree."""
        refs = [0] * self.num_blocks
        for table in self.block_tables.values():
            for block_id in table:
                refs[block_id] += 1
        free_ids = self.free_queue.ids()
        assert len(free_ids) == len(set(free_ids)) == self.num_free_blocks, "free list corrupt"
        free_set = set(free_ids)
        for block in self.blocks:
            assert block.ref_count == refs[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count} but {refs[block.block_id]} "
                "tables hold it"
            )
            assert (block.ref_count == 0) == (block.block_id in free_set), (
                f"block {block.block_id}: ref_count {block.ref_count} vs free list membership"
            )
        for block_hash, block in self.cached.items():
            assert block.block_hash == block_hash, (
                f"cache entry for block {block.block_id} is stale"
            )

    def assert_all_free(self) -> None:
        """After every request ended: all blocks free (or cached-free), no tables left."""
        self.check_invariants()
        assert not self.block_tables, f"tables still held: {sorted(self.block_tables)}"
        assert self.num_free_blocks == self.num_blocks, (
            f"{self.num_blocks - self.num_free_blocks} blocks still referenced"
        )
