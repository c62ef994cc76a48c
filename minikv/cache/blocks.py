"""The block manager: which cache blocks each sequence owns, and the prefix cache over full blocks.
See docs/internals.md#cache-blocks."""
from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence as SequenceOf
from typing import Protocol

from minikv.kernels.addressing import slot_of  # noqa: F401  (the slot formula, written once; re-exported)


class BlockTableHolder(Protocol):
    """What the block manager needs from a request (the engine's `Sequence` implements it)."""

    request_id: int
    token_ids: list[int]
    encoder_token_ids: list[int] | None
    block_table: list[int]
    num_cached_tokens: int

    def __len__(self) -> int: ...

# Parent hash of a decoder-only sequence's first block: CPython's hash() never returns -1.
NO_PARENT = -1


def block_hash(parent_hash: int, token_ids: SequenceOf[int]) -> int:
    """Chained content hash of one full block: covers the previous block's hash and this block's token ids."""
    return hash((parent_hash, tuple(token_ids)))


def chain_root(seq: BlockTableHolder) -> int:
    """The parent hash of a sequence's first block."""
    if seq.encoder_token_ids is None:
        return NO_PARENT
    return hash((tuple(seq.encoder_token_ids),))


class BlockManager:
    """Hands out cache blocks to sequences and, optionally, shares full blocks between equal prefixes."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = bool(enable_prefix_caching)
        # Per block, plain lists rather than an object each: an arena holds hundreds of thousands of blocks, and
        # Python's garbage collector walks every tracked object in a full collection (a pause of tens of ms).
        self._refs = [0] * num_blocks
        self._hashes: list[int | None] = [None] * num_blocks   # set once the block is full (prefix caching only)
        self._tokens: list[tuple[int, ...]] = [()] * num_blocks  # kept with the hash: a collision never false-hits
        self._free_uncached: list[int] = list(range(num_blocks))   # a min-heap: the lowest id comes out first
        self._returned: list[int] = []   # freed since the last take, not yet in the heap (see _take_free_block)
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # free but revivable, oldest freed first
        self._hash_to_block: dict[int, int] = {}
        self.num_hit_blocks = 0       # prefix-cache hits over the manager's life
        self.num_evictions = 0        # cached-free blocks whose hash was forgotten to make room

    @property
    def num_free_blocks(self) -> int:
        """Blocks not held by any sequence (never used, uncached, or cached-free)."""
        return len(self._free_uncached) + len(self._returned) + len(self._free_cached)

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return (num_tokens + self.block_size - 1) // self.block_size

    def ref_count(self, block_id: int) -> int:
        return self._refs[block_id]

    def is_cached(self, block_id: int) -> bool:
        """True when the block's content is registered, so a matching prefix can hit it."""
        h = self._hashes[block_id]
        return h is not None and self._hash_to_block.get(h) == block_id

    def cached_free_block_ids(self) -> list[int]:
        """Free blocks that can still be revived, in eviction order (next to be evicted first)."""
        return list(self._free_cached)

    def can_allocate(self, seq: BlockTableHolder) -> bool:
        """True when `allocate(seq)` would find enough blocks. Hits on blocks in use cost no free block."""
        hits = self._match_prefix(seq)
        shared_in_use = sum(1 for block_id in hits if self._refs[block_id] > 0)
        return self.blocks_for_tokens(len(seq)) - shared_in_use <= self.num_free_blocks

    def allocate(self, seq: BlockTableHolder) -> None:
        """Give `seq` blocks for all of `seq.token_ids` (a prefill, first or after preemption)."""
        if seq.block_table:
            raise RuntimeError(f"request {seq.request_id} already holds blocks {seq.block_table}")
        if not self.can_allocate(seq):
            raise RuntimeError(f"request {seq.request_id} needs {self.blocks_for_tokens(len(seq))} blocks, "
                               f"{self.num_free_blocks} are free; check can_allocate() first")
        hits = self._match_prefix(seq)
        table: list[int] = []
        parent = chain_root(seq)
        for block_id in hits:
            if self._refs[block_id] == 0:
                del self._free_cached[block_id]   # revive it
            self._refs[block_id] += 1
            table.append(block_id)
            parent = self._hashes[block_id]
        bs = self.block_size
        for index in range(len(hits), self.blocks_for_tokens(len(seq))):
            block_id = self._take_free_block()
            table.append(block_id)
            tokens = seq.token_ids[index * bs:(index + 1) * bs]
            if self.enable_prefix_caching and len(tokens) == bs:
                parent = self._register(block_id, parent, tokens)
        seq.block_table = table
        seq.num_cached_tokens = len(hits) * bs
        self.num_hit_blocks += len(hits)

    def can_append(self, seq: BlockTableHolder) -> bool:
        """True when `may_append(seq)` can succeed: no new block is needed, or a free one exists."""
        return len(seq.block_table) >= self.blocks_for_tokens(len(seq)) or self.num_free_blocks >= 1

    def may_append(self, seq: BlockTableHolder) -> None:
        """Make room for the decode step that computes the K/V of the last token."""
        n = len(seq)
        needed, have = self.blocks_for_tokens(n), len(seq.block_table)
        if have not in (needed - 1, needed):
            raise RuntimeError(f"request {seq.request_id}: block table covers {have} blocks, but {n} tokens "
                               f"need {needed}; may_append adds at most one block per token")
        if have == needed - 1:
            seq.block_table.append(self._take_free_block())
        if self.enable_prefix_caching and n % self.block_size == 0:
            index = n // self.block_size - 1
            parent = chain_root(seq) if index == 0 else self._hashes[seq.block_table[index - 1]]
            if parent is not None:
                tokens = seq.token_ids[index * self.block_size:]
                self._register(seq.block_table[index], parent, tokens)

    def deallocate(self, seq: BlockTableHolder) -> None:
        """Release the sequence's blocks (ref_count - 1) and reset its block table and cached-token count."""
        self.free_blocks(seq.block_table)
        seq.block_table = []
        seq.num_cached_tokens = 0

    # ---- plain token ranges (the encoder-decoder's cross pool) ------------------------------------------
    def can_allocate_tokens(self, num_tokens: int) -> bool:
        return self.blocks_for_tokens(num_tokens) <= self.num_free_blocks

    def allocate_tokens(self, num_tokens: int) -> list[int]:
        """Blocks for `num_tokens` tokens that are not shared or hashed (lowest ids first)."""
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be at least 1, got {num_tokens}")
        needed = self.blocks_for_tokens(num_tokens)
        if needed > self.num_free_blocks:
            raise RuntimeError(f"{num_tokens} tokens need {needed} blocks, {self.num_free_blocks} are free")
        return [self._take_free_block() for _ in range(needed)]

    def free_blocks(self, block_ids: list[int]) -> None:
        """Release blocks (ref_count - 1 each), last to first. At zero a registered block becomes revivable; any
        other is cleared and returned to the uncached pool."""
        refs, hashes, registered, returned = self._refs, self._hashes, self._hash_to_block, self._returned
        for block_id in reversed(block_ids):
            count = refs[block_id] - 1
            if count < 0:
                raise RuntimeError(f"block {block_id} released more often than it was taken")
            refs[block_id] = count
            if count:
                continue
            h = hashes[block_id]
            if h is not None and registered.get(h) == block_id:       # is_cached: revivable
                self._free_cached[block_id] = None
                continue
            if h is not None:
                hashes[block_id], self._tokens[block_id] = None, ()
            returned.append(block_id)

    def _match_prefix(self, seq: BlockTableHolder) -> list[int]:
        """Registered blocks matching the start of `seq`, capped so at least one token is left to compute."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        parent = chain_root(seq)
        for index in range((len(seq) - 1) // bs):
            tokens = tuple(seq.token_ids[index * bs:(index + 1) * bs])
            h = block_hash(parent, tokens)
            block_id = self._hash_to_block.get(h)
            if block_id is None or self._tokens[block_id] != tokens:
                break
            hits.append(block_id)
            parent = h
        return hits

    def _register(self, block_id: int, parent: int, tokens: SequenceOf[int]) -> int:
        """Record a full block's content hash; the first block registered with a hash keeps it."""
        self._tokens[block_id] = tuple(tokens)
        self._hashes[block_id] = h = block_hash(parent, self._tokens[block_id])
        self._hash_to_block.setdefault(h, block_id)
        return h

    def _take_free_block(self) -> int:
        # Freed blocks join the heap only now, so a burst of frees (64 requests of 32k tokens finishing in one step
        # return 131,072 blocks) costs one heapify at the next take instead of a push per block.
        heap, returned = self._free_uncached, self._returned
        if returned and len(returned) > len(heap) // 8:
            heap += returned
            heapq.heapify(heap)
            returned.clear()
        while returned:
            heapq.heappush(heap, returned.pop())
        if heap:
            block_id = heapq.heappop(heap)
        elif self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            self._forget(block_id)
            self.num_evictions += 1
        else:
            raise RuntimeError("no free cache block left")
        self._refs[block_id] = 1
        return block_id

    def _forget(self, block_id: int) -> None:
        if self.is_cached(block_id):
            del self._hash_to_block[self._hashes[block_id]]
        self._hashes[block_id], self._tokens[block_id] = None, ()
