"""write_kv (Triton, interpreter) against write_kv_reference: the pools must end up byte-identical."""
from __future__ import annotations

import pytest
import torch

from conftest import (BLOCK_SIZES, CPU_FORMATS, HEAD_SIZES, attention_tolerance, make_pool, make_spec,
                      random_block_tables, sample_cases)
from minikv.cache.arena import KVArena, PoolSpec
from minikv.kernels import (formats, paged_decode_attention, paged_decode_attention_reference, write_kv,
                            write_kv_reference)
from minikv.kernels.addressing import gather_rows, sequence_slots

KV_HEADS = [1, 2, 4]
TOKEN_COUNTS = ["one", "block-1", "block", "block+1", "many"]


def _num_tokens(kind: str, block_size: int) -> int:
    return {"one": 1, "block-1": block_size - 1, "block": block_size, "block+1": block_size + 1,
            "many": 3 * block_size + 5}[kind]


def _write_both(spec, key, value, slots, num_blocks, k_scale=1.0, v_scale=1.0):
    pool = make_pool(spec, num_blocks)
    expected = pool.clone()
    write_kv(key, value, pool, slots, spec, k_scale, v_scale)
    write_kv_reference(key, value, expected, slots, spec, k_scale, v_scale)
    return pool, expected


CASES = sample_cases(11, 40, CPU_FORMATS, BLOCK_SIZES, KV_HEADS, HEAD_SIZES, TOKEN_COUNTS)


@pytest.mark.parametrize("fmt,block_size,kv_heads,head_size,count", CASES)
def test_write_matches_reference_bytes(fmt, block_size, kv_heads, head_size, count):
    kv_cache_dtype, dtype = fmt
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    num_tokens = _num_tokens(count, block_size)
    num_blocks = -(-num_tokens // block_size) + 2
    # scattered slots in random blocks, a few tokens skipped with -1
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    if num_tokens > 2:
        slots[torch.randperm(num_tokens)[:2]] = -1
    key = (torch.randn(num_tokens, kv_heads, head_size) * 3).to(dtype)
    value = torch.randn(num_tokens, kv_heads, head_size).to(dtype)
    pool, expected = _write_both(spec, key, value, slots, num_blocks, k_scale=0.37, v_scale=1.9)
    assert torch.equal(pool, expected)
    if num_tokens > 2:      # the random initial bytes of skipped and unused slots survive
        assert not torch.equal(pool, make_pool(spec, num_blocks))


@pytest.mark.parametrize("kv_cache_dtype", ["int8_per_token_head", "fp8_per_token_head"])
def test_zero_head_gets_finite_scale_and_zero_codes(kv_cache_dtype):
    spec = make_spec(kv_cache_dtype, torch.float32, 2, 16, 8)
    key = torch.randn(3, 2, 16)
    key[1, 0] = 0.0
    value = torch.zeros(3, 2, 16)
    slots = torch.tensor([0, 5, 9])
    pool, expected = _write_both(spec, key, value, slots, 2)
    assert torch.equal(pool, expected)
    codes, scales = gather_rows(pool, spec, slots, 0)
    assert scales[1, 0].item() == pytest.approx(formats.SCALE_EPS)
    assert torch.all(codes[1, 0].to(torch.float32) == 0)
    v_codes, v_scales = gather_rows(pool, spec, slots, 1)
    assert torch.isfinite(v_scales).all() and torch.all(v_codes.to(torch.float32) == 0)


def test_int8_ties_round_to_even():
    spec = make_spec("int8_per_token_head", torch.float32, 1, 16, 8)
    # amax 127 makes the scale exactly 1.0, so x / scale keeps the .5 ties
    row = torch.tensor([127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.5, 126.5, -127.0, 0.0, 4.4, 4.6, -4.6, 7.5, 8.5])
    key = row.reshape(1, 1, 16)
    pool, expected = _write_both(spec, key, key.clone(), torch.tensor([3]), 1)
    assert torch.equal(pool, expected)
    codes, scales = gather_rows(pool, spec, torch.tensor([3]), 0)
    assert scales.item() == 1.0
    assert codes.flatten().tolist() == [127, 2, 4, -2, -4, 0, 0, 2, 126, -127, 0, 4, 5, -5, 8, 8]


def test_fp8_layer_scale_saturates_instead_of_nan():
    spec = make_spec("fp8", torch.float16, 1, 16, 8)
    key = torch.tensor([60000.0, -60000.0, 500.0, -470.0] + [1.0] * 12, dtype=torch.float16).reshape(1, 1, 16)
    pool, expected = _write_both(spec, key, key.clone(), torch.tensor([0]), 1, k_scale=1.0, v_scale=0.5)
    assert torch.equal(pool, expected)
    codes, _ = gather_rows(pool, spec, torch.tensor([0]), 0)
    assert codes.view(torch.uint8).flatten()[:4].tolist() == [0x7E, 0xFE, 0x7E, 0xFE]


def test_strided_key_value_views():
    """K and V as views into a fused qkv projection output (row stride larger than heads x head size)."""
    spec = make_spec("int8_per_token_head", torch.float16, 2, 32, 16)
    qkv = torch.randn(20, 8 * 32).to(torch.float16)
    key = qkv[:, 4 * 32:6 * 32].view(20, 2, 32)
    value = qkv[:, 6 * 32:].view(20, 2, 32)
    assert not key.is_contiguous()
    slots = torch.randperm(64)[:20]
    pool, expected = _write_both(spec, key, value, slots, 4)
    assert torch.equal(pool, expected)


def test_all_skipped_writes_nothing():
    spec = make_spec("auto", torch.float16, 2, 16, 8)
    pool = make_pool(spec, 2)
    before = pool.clone()
    write_kv(torch.randn(4, 2, 16).half(), torch.randn(4, 2, 16).half(), pool, torch.full((4,), -1), spec)
    assert torch.equal(pool, before)


def test_pool_view_inside_a_larger_allocation():
    """A pool that is a slice of an arena: the bytes around it stay untouched."""
    spec = make_spec("fp8_per_token_head", torch.float32, 2, 16, 8)
    arena = torch.zeros(256 + 3 * spec.block_bytes + 256, dtype=torch.uint8)
    pool = arena[256:256 + 3 * spec.block_bytes]
    key, value = torch.randn(24, 2, 16), torch.randn(24, 2, 16)
    write_kv(key, value, pool, torch.arange(24), spec)
    expected = torch.zeros(3 * spec.block_bytes, dtype=torch.uint8)
    write_kv_reference(key, value, expected, torch.arange(24), spec)
    assert torch.equal(pool, expected)
    assert not arena[:256].any() and not arena[-256:].any()


WIDE_FORMATS = [("auto", torch.float32), ("fp8", torch.float16), ("int8_per_token_head", torch.float16),
                ("fp8_per_token_head", torch.float32)]


@pytest.mark.parametrize("fmt", WIDE_FORMATS)
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_write_head_size_512(fmt, kv_heads):
    """gemma-4-E2B's full layers: head size 512."""
    kv_cache_dtype, dtype = fmt
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, 512, 16)
    slots = torch.randperm(4 * 16)[:21]
    slots[::5] = -1
    key = (torch.randn(21, kv_heads, 512) * 3).to(dtype)
    value = torch.randn(21, kv_heads, 512).to(dtype)
    pool, expected = _write_both(spec, key, value, slots, 4, k_scale=0.37, v_scale=1.9)
    assert torch.equal(pool, expected)


def check_mixed_layouts(fmt, shapes, block_size: int, device) -> None:
    """Pools of different layouts (one per (kv heads, head size) in `shapes`) side by side in one KVArena, as the
    engine allocates Gemma-4's sliding and full layers: each written and read through its own layout, the bytes
    equal the reference writer's, attention equals the reference, and no write leaves its pool (guards intact)."""
    kv_cache_dtype, dtype = fmt
    lens = [1, block_size + 3, 3 * block_size - 1]
    tables, num_blocks = random_block_tables(lens, block_size, device=device)
    specs = [PoolSpec(f"kv.{i}", make_spec(kv_cache_dtype, dtype, h, d, block_size), num_blocks)
             for i, (h, d) in enumerate(shapes)]
    assert len({s.layout.block_bytes for s in specs}) == len(specs)
    arena = KVArena(specs, device)
    slots = torch.cat([sequence_slots(tables[b], n, block_size) for b, n in enumerate(lens)])
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    for s in specs:                               # write every pool first, then read each back
        lay = s.layout
        key = (torch.randn(sum(lens), lay.num_kv_heads, lay.head_size) * 3).to(dtype).to(device)
        value = torch.randn(sum(lens), lay.num_kv_heads, lay.head_size).to(dtype).to(device)
        expected = torch.zeros_like(arena.pool(s.name))
        write_kv(key, value, arena.pool(s.name), slots, lay, 0.5, 1.5)
        write_kv_reference(key, value, expected, slots, lay, 0.5, 1.5)
        assert torch.equal(arena.pool(s.name), expected), s.name
    arena.check()
    for s in specs:
        lay = s.layout
        q = torch.randn(len(lens), 4 * lay.num_kv_heads, lay.head_size).to(dtype).to(device)
        args = (q, arena.pool(s.name), tables, seq_lens, lay, lay.head_size ** -0.5, 0.5, 1.5)
        torch.testing.assert_close(paged_decode_attention(*args).float(),
                                   paged_decode_attention_reference(*args).float(), **attention_tolerance(dtype))


@pytest.mark.parametrize("fmt", WIDE_FORMATS)
@pytest.mark.parametrize("shapes", [[(2, 16), (1, 64)], [(1, 256), (1, 512)]])
def test_mixed_layouts_in_one_arena(fmt, shapes):
    check_mixed_layouts(fmt, shapes, 8, "cpu")
