"""Physical KV blocks: ref counts, chained prefix hashes, and an LRU free queue.

As vLLM v1's ``BlockPool`` / ``KVCacheManager`` and nano-vllm's ``BlockManager``:

* A block holds ``block_size`` token positions of K/V in every layer.
* Only *full* blocks get a hash, chained through the parent so a block is identified by its whole
  prefix; a hit compares the parent hash and the token ids too, so a collision never serves wrong K/V.
* A freed block (ref count 0) keeps its hash and its K/V and goes to the tail of the free
  queue: it can still be hit until it is reused. Allocation pops the queue head, so the
  least recently freed block is evicted first.

    free queue (head = next evicted)       cached: hash -> block id
    [ 7 ][ 3 ][ 12 ][ 5 ] <- freed blocks join here
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def hash_block_tokens(parent_hash: int | None, block_token_ids: Sequence[int]) -> int:
    """Chained hash of one full block: depends on every token before it through ``parent_hash``."""
    return hash((parent_hash, tuple(block_token_ids)))


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None  # set once the block is full and cached
    parent_hash: int | None = None
    token_ids: tuple[int, ...] | None = None

    def reset_hash(self) -> None:
        self.block_hash = self.parent_hash = self.token_ids = None


class BlockPool:
    """Owns every KV block and decides which one is handed out next (``enable_caching``: keep the hashes
    of full blocks so later requests can hit them)."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached_block_ids: dict[int, int] = {}  # block hash -> block id
        self.evicted_block_ids: list[int] = []  # cached blocks reused since the last drain

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_queue)

    def allocate(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` from the head of the free queue (evicting their cached K/V)."""
        if not self.can_allocate(num_blocks):
            raise RuntimeError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                if self.cached_block_ids.get(block.block_hash) == block_id:
                    del self.cached_block_ids[block.block_hash]
                block.reset_hash()
                self.evicted_block_ids.append(block_id)
            block.ref_cnt = 1
            block_ids.append(block_id)
        return block_ids

    def lookup(self, parent_hash: int | None, block_token_ids: Sequence[int]) -> int | None:
        """The cached block holding exactly these tokens after this parent, or None."""
        if not self.enable_caching:
            return None
        block_hash = hash_block_tokens(parent_hash, block_token_ids)
        block_id = self.cached_block_ids.get(block_hash)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.parent_hash != parent_hash or block.token_ids != tuple(block_token_ids):
            return None  # a hash collision: never serve another prefix's K/V
        return block_id

    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on hit blocks; a block with no owner leaves the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                del self.free_queue[block_id]
            block.ref_cnt += 1

    def cache_full_block(self, block_id: int, parent_hash: int | None, block_token_ids: Sequence[int]) -> int:
        """Record that ``block_id`` is full; returns its chained hash."""
        block_hash = hash_block_tokens(parent_hash, block_token_ids)
        if self.enable_caching:
            block = self.blocks[block_id]
            block.block_hash, block.parent_hash, block.token_ids = block_hash, parent_hash, tuple(block_token_ids)
            self.cached_block_ids.setdefault(block_hash, block_id)
        return block_hash

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block, in the order given (a request's blocks come tail first: its
        last blocks, the least likely to be shared, reach the queue first and are evicted first)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block_id, last=False)  # holds nothing: reuse first

    def drain_evicted(self) -> list[int]:
        evicted, self.evicted_block_ids = self.evicted_block_ids, []
        return evicted
