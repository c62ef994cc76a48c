"""Block manager: allocation order, prefix cache (chained hashes, refcounts), eviction, cross-pool helpers."""
import pytest

import minikv.cache.blocks as blocks_module
from minikv.cache.blocks import BlockManager, block_hash
from minikv.engine.sequence import Sequence


def make_seq(token_ids, request_id=0, encoder_token_ids=None):
    return Sequence(request_id, "", list(token_ids), encoder_token_ids=encoder_token_ids)


def test_allocation_takes_lowest_free_block_first():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_seq(range(10), 0)
    b = make_seq(range(100, 105), 1)
    bm.allocate(a)
    bm.allocate(b)
    assert a.block_table == [0, 1, 2]
    assert b.block_table == [3, 4]
    bm.deallocate(a)
    assert bm.num_free_blocks == 6
    c = make_seq(range(200, 206), 2)
    bm.allocate(c)
    assert c.block_table == [0, 1]          # the freed low ids come back first, in order
    b.append_token(7)
    b.append_token(8)
    b.append_token(9)
    bm.may_append(b)                         # 8 tokens: still two blocks
    assert b.block_table == [3, 4]
    b.append_token(10)
    bm.may_append(b)                         # the 9th token starts a block: the lowest free one, 2
    assert b.block_table == [3, 4, 2]


def test_prefix_hit_shares_full_blocks_and_counts_references():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(10), 0)
    bm.allocate(a)
    assert a.block_table == [0, 1, 2] and a.num_cached_tokens == 0
    b = make_seq(list(range(8)) + [99, 98], 1)
    bm.allocate(b)
    assert b.block_table == [0, 1, 3]
    assert b.num_cached_tokens == 8
    assert [bm.ref_count(i) for i in range(4)] == [2, 2, 1, 1]
    assert bm.num_hit_blocks == 2


def test_a_different_earlier_block_prevents_a_hit():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(12), 0)
    bm.allocate(a)
    # Block 1 holds the same tokens as a's block 1, but block 0 differs: the chained hash differs.
    c = make_seq([50, 51, 52, 53] + list(range(4, 12)), 1)
    bm.allocate(c)
    assert c.num_cached_tokens == 0
    assert c.block_table == [3, 4, 5]
    assert bm.ref_count(1) == 1
    assert block_hash(block_hash(-1, [0, 1, 2, 3]), [4, 5, 6, 7]) != block_hash(
        block_hash(-1, [50, 51, 52, 53]), [4, 5, 6, 7])


def test_partial_last_block_is_never_cached():
    bm = BlockManager(num_blocks=10, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(6), 0)
    bm.allocate(a)
    assert bm.is_cached(a.block_table[0]) and not bm.is_cached(a.block_table[1])
    b = make_seq(list(range(6)) + [40, 41, 42], 1)
    bm.allocate(b)
    assert b.num_cached_tokens == 4            # only the full block 0 is shared
    assert b.block_table[0] == a.block_table[0] and b.block_table[1] != a.block_table[1]


def test_at_least_one_token_is_always_computed():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(8), 0)
    bm.allocate(a)
    same = make_seq(range(8), 1)               # all 8 tokens cached, but the last one must be computed
    bm.allocate(same)
    assert same.num_cached_tokens == 4
    assert same.block_table[0] == a.block_table[0] and same.block_table[1] != a.block_table[1]
    longer = make_seq(range(9), 2)
    bm.allocate(longer)
    assert longer.num_cached_tokens == 8
    assert longer.block_table[:2] == a.block_table
    one_block = make_seq(range(4), 3)
    bm.allocate(one_block)
    assert one_block.num_cached_tokens == 0


def test_uncached_blocks_go_first_then_cached_free_ones_oldest_freed_first():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(8), 0)
    bm.allocate(a)                              # [0, 1], both full and registered
    bm.deallocate(a)                            # released last to first: 1 is freed before 0
    assert bm.num_free_blocks == 4
    assert bm.cached_free_block_ids() == [1, 0]
    d = make_seq(range(100, 105), 1)
    bm.allocate(d)
    assert d.block_table == [2, 3]              # never-used blocks first: nothing evicted yet
    assert bm.num_evictions == 0
    e = make_seq(range(200, 203), 2)
    bm.allocate(e)
    assert e.block_table == [1]                 # then the least recently freed cached block
    assert bm.num_evictions == 1 and not bm.is_cached(1)
    assert bm.cached_free_block_ids() == [0]
    # a's first block survived: a request with a's prefix still hits it
    again = make_seq(range(5), 3)
    assert bm.can_allocate(again) is False      # needs 2 blocks; free are block 0 (its hit) and nothing else
    bm.deallocate(e)
    bm.allocate(again)
    assert again.block_table == [0, 1] and again.num_cached_tokens == 4


def test_freed_cached_block_is_revived_by_a_hit():
    bm = BlockManager(num_blocks=6, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(9), 0)
    bm.allocate(a)
    bm.deallocate(a)
    assert [bm.ref_count(i) for i in range(3)] == [0, 0, 0]
    assert bm.cached_free_block_ids() == [1, 0]     # block 2 was partial: freed as a plain block
    b = make_seq(list(range(8)) + [77, 78], 1)
    bm.allocate(b)
    assert b.block_table[:2] == [0, 1] and b.num_cached_tokens == 8
    assert [bm.ref_count(i) for i in range(2)] == [1, 1]
    assert bm.cached_free_block_ids() == []
    assert bm.num_free_blocks == 3


def test_can_allocate_counts_hits_on_blocks_in_use_as_free():
    bm = BlockManager(num_blocks=3, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(8), 0)
    bm.allocate(a)
    b = make_seq(list(range(8)) + [9], 1)        # 3 blocks, 2 of them shared with a: needs only 1 free
    assert bm.num_free_blocks == 1 and bm.can_allocate(b)
    bm.allocate(b)
    assert b.block_table == [0, 1, 2]
    c = make_seq(range(50, 55), 2)
    assert not bm.can_allocate(c)
    with pytest.raises(RuntimeError, match="needs 2 blocks"):
        bm.allocate(c)



@pytest.mark.parametrize("finishing", [1, 30])
def test_freed_blocks_come_back_lowest_first_whether_few_or_a_burst(finishing):
    """Freed blocks wait beside the heap until the next take: a few are pushed one by one, a burst (here 30 of 32
    requests, 120 of 128 blocks) joins it in one heapify. Either way the lowest free ids come out first."""
    bm = BlockManager(num_blocks=128, block_size=4)
    seqs = [make_seq(range(16), i) for i in range(32)]
    for s in seqs:
        bm.allocate(s)
    order = [7, 3, *range(31, 7, -1), 0, 5, 6, 2, 1, 4][:finishing]
    for i in order:
        bm.deallocate(seqs[i])
    assert bm.num_free_blocks == 4 * finishing
    freed = sorted(b for i in order for b in range(4 * i, 4 * i + 4))
    assert bm.allocate_tokens(16 * finishing) == freed     # 4 blocks of 4 tokens per request
    assert bm.num_free_blocks == 0 and all(bm.ref_count(b) == 1 for b in range(128))


def test_the_manager_keeps_no_object_per_block():
    """A full garbage collection walks every tracked object: a million-block arena must not add a million."""
    import gc
    gc.collect()
    before = len(gc.get_objects())
    bm = BlockManager(num_blocks=1_000_000, block_size=16, enable_prefix_caching=True)
    assert len(gc.get_objects()) - before < 100
    assert bm.num_free_blocks == 1_000_000

def test_deallocate_drops_one_reference_and_frees_at_zero():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(10), 0)
    b = make_seq(list(range(8)) + [60, 61], 1)
    bm.allocate(a)
    bm.allocate(b)
    assert bm.num_free_blocks == 4
    bm.deallocate(a)
    assert a.block_table == [] and a.num_cached_tokens == 0
    assert [bm.ref_count(i) for i in range(4)] == [1, 1, 0, 1]
    assert bm.num_free_blocks == 5
    bm.deallocate(b)
    assert [bm.ref_count(i) for i in range(4)] == [0, 0, 0, 0]
    assert bm.num_free_blocks == 8
    with pytest.raises(RuntimeError, match="released more often"):
        bm.free_blocks([0])


def test_decode_registers_the_block_its_token_fills():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = make_seq([5, 6, 7], 0)
    bm.allocate(a)
    assert not bm.is_cached(0)
    a.append_token(8)
    assert bm.can_append(a)
    bm.may_append(a)                             # 4 tokens: block 0 is now full and registered
    assert a.block_table == [0] and bm.is_cached(0)
    a.append_token(9)
    bm.may_append(a)
    assert a.block_table == [0, 1]
    b = make_seq([5, 6, 7, 8, 1], 1)
    bm.allocate(b)
    assert b.block_table[0] == 0 and b.num_cached_tokens == 4


def test_can_append_is_false_only_when_a_new_block_is_needed_and_none_is_free():
    bm = BlockManager(num_blocks=2, block_size=4)
    a = make_seq(range(4), 0)
    b = make_seq(range(10, 14), 1)
    bm.allocate(a)
    bm.allocate(b)
    a.append_token(4)
    assert bm.num_free_blocks == 0 and not bm.can_append(a)
    bm.deallocate(b)
    assert bm.can_append(a)
    bm.may_append(a)
    assert a.block_table == [0, 1]
    with pytest.raises(RuntimeError, match="at most one block"):
        a.token_ids.extend(range(8))           # 13 tokens need 4 blocks; the table has 2
        bm.may_append(a)


def test_without_prefix_caching_equal_prompts_share_nothing():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = make_seq(range(9), 0)
    b = make_seq(range(9), 1)
    bm.allocate(a)
    bm.allocate(b)
    assert a.block_table == [0, 1, 2] and b.block_table == [3, 4, 5]
    assert b.num_cached_tokens == 0
    bm.deallocate(a)
    assert bm.cached_free_block_ids() == [] and bm.num_free_blocks == 5


def test_a_hash_collision_never_produces_a_false_hit(monkeypatch):
    monkeypatch.setattr(blocks_module, "block_hash", lambda parent, tokens: 12345)
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(5), 0)
    b = make_seq(range(20, 25), 1)
    bm.allocate(a)
    bm.allocate(b)
    assert b.num_cached_tokens == 0 and b.block_table == [2, 3]


def test_encoder_tokens_seed_the_hash_chain():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a = make_seq(range(5), 0, encoder_token_ids=[1, 2, 3])
    other_input = make_seq(range(5), 1, encoder_token_ids=[1, 2, 4])
    same_input = make_seq(range(5), 2, encoder_token_ids=[1, 2, 3])
    bm.allocate(a)
    bm.allocate(other_input)
    bm.allocate(same_input)
    assert other_input.num_cached_tokens == 0
    assert same_input.num_cached_tokens == 4 and same_input.block_table[0] == a.block_table[0]


def test_cross_pool_token_ranges():
    cross = BlockManager(num_blocks=5, block_size=4)
    assert cross.blocks_for_tokens(10) == 3
    first = cross.allocate_tokens(10)
    second = cross.allocate_tokens(4)
    assert first == [0, 1, 2] and second == [3]
    assert cross.can_allocate_tokens(4) and not cross.can_allocate_tokens(5)
    with pytest.raises(RuntimeError, match="need 2 blocks"):
        cross.allocate_tokens(5)
    cross.free_blocks(first)
    assert cross.allocate_tokens(8) == [0, 1]
    with pytest.raises(ValueError, match="at least 1"):
        cross.allocate_tokens(0)


@pytest.mark.parametrize("kwargs", [{"num_blocks": 0, "block_size": 4}, {"num_blocks": 4, "block_size": 0}])
def test_bad_sizes_are_rejected(kwargs):
    with pytest.raises(ValueError, match="must be a positive int"):
        BlockManager(**kwargs)
