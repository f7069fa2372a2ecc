"""BlockPool: hash chains, hits, ref counts and LRU eviction order, with no model."""

from prefillviz.engine.block_pool import BlockPool, hash_block_tokens


def test_allocate_takes_blocks_in_order_and_counts_free():
    pool = BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    assert pool.num_free_blocks == 2
    assert pool.can_allocate(2) and not pool.can_allocate(3)


def test_hash_is_chained_through_the_parent():
    first = hash_block_tokens(None, [1, 2])
    assert hash_block_tokens(first, [3, 4]) != hash_block_tokens(None, [3, 4])
    assert hash_block_tokens(first, [3, 4]) == hash_block_tokens(hash_block_tokens(None, [1, 2]), [3, 4])


def test_cached_block_is_hit_only_with_the_same_parent_and_tokens():
    pool = BlockPool(4)
    [block] = pool.allocate(1)
    block_hash = pool.cache_full_block(block, None, [5, 6])
    assert pool.lookup(None, [5, 6]) == block
    assert pool.lookup(None, [5, 7]) is None
    assert pool.lookup(block_hash, [5, 6]) is None  # same tokens, different prefix


def test_hash_collision_is_refused_by_comparing_tokens():
    pool = BlockPool(4)
    [block] = pool.allocate(1)
    block_hash = pool.cache_full_block(block, None, [5, 6])
    pool.blocks[block].token_ids = (9, 9)  # pretend another prefix landed on this hash
    assert pool.cached_block_ids[block_hash] == block
    assert pool.lookup(None, [5, 6]) is None


def test_touch_takes_a_free_cached_block_out_of_the_queue_and_free_returns_it():
    pool = BlockPool(3)
    [block] = pool.allocate(1)
    pool.cache_full_block(block, None, [1, 2])
    pool.free([block])
    assert pool.num_free_blocks == 3 and pool.blocks[block].ref_cnt == 0
    pool.touch([block])
    pool.touch([block])  # a second request shares it
    assert pool.blocks[block].ref_cnt == 2 and pool.num_free_blocks == 2
    pool.free([block])
    assert pool.num_free_blocks == 2  # still held by one request
    pool.free([block])
    assert pool.num_free_blocks == 3


def test_freed_tail_blocks_are_evicted_first_and_hashes_dropped():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    parent = None
    for i, block in enumerate(blocks):
        parent = pool.cache_full_block(block, parent, [i, i])
    pool.free(list(reversed(blocks)))  # a finished request frees its tail first
    assert list(pool.free_queue) == [3, 2, 1, 0]
    assert pool.allocate(1) == [3]
    assert pool.drain_evicted() == [3]
    assert pool.blocks[3].block_hash is None
    assert len(pool.cached_block_ids) == 3
    # the head of the prefix survives and still hits
    assert pool.lookup(None, [0, 0]) == 0


def test_uncached_free_blocks_are_reused_before_cached_ones():
    pool = BlockPool(3)
    cached, plain = pool.allocate(2)
    pool.cache_full_block(cached, None, [1, 1])
    pool.free([cached])
    pool.free([plain])  # holds nothing worth keeping
    assert pool.allocate(2) == [plain, 2]
    assert pool.drain_evicted() == []


def test_caching_disabled_never_hits():
    pool = BlockPool(2, enable_caching=False)
    [block] = pool.allocate(1)
    pool.cache_full_block(block, None, [1, 2])
    pool.free([block])
    assert pool.lookup(None, [1, 2]) is None
