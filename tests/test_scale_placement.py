"""The "block" scale placement of the per-token-head formats, next to vLLM's "row" placement.

Byte arithmetic of KVLayout (rows, scales, views), write/decode/paged-context kernels against their references for
the block placement (the row placement is the existing matrix), and defect A's scale wipe reproduced with it.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import minikv
from conftest import (attention_tolerance, cu_seqlens, fill_sequences, length_choices, make_pool, make_spec,
                      random_block_tables, sample_cases)
from minikv.cache.layout import KVLayout, KVLayoutMismatchError
from minikv.config import CacheConfig
from minikv.kernels import (formats, launch, paged_context_attention, paged_context_attention_reference,
                            paged_decode_attention, paged_decode_attention_reference, write_kv, write_kv_reference)
from minikv.kernels import addressing
from minikv.kernels.addressing import check_spec, gather_rows, row_alignment

PTH = [("int8_per_token_head", torch.float16), ("int8_per_token_head", torch.float32),
       ("fp8_per_token_head", torch.float16), ("fp8_per_token_head", torch.float32)]


# ---- layout ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kv_cache_dtype", ["int8_per_token_head", "fp8_per_token_head"])
@pytest.mark.parametrize("heads,head_size,block_size", [(8, 128, 16), (3, 16, 8), (1, 64, 32)])
def test_block_placement_bytes(kv_cache_dtype, heads, head_size, block_size):
    row = KVLayout(kv_cache_dtype, torch.float16, heads, head_size, block_size, "row")
    blk = KVLayout(kv_cache_dtype, torch.float16, heads, head_size, block_size, "block")
    assert row.row_bytes == head_size + 4 and blk.row_bytes == head_size
    assert row_alignment(row.spec) == 4 and row_alignment(blk.spec) == 16     # wide loads need "block"
    assert blk.kv_bytes % 16 == 0 and blk.kv_bytes >= row.kv_bytes            # padding only
    assert blk.spec.placement == formats.BLOCK and row.spec.placement == formats.ROW
    # one head's scales of a block are one contiguous run, after the half's codes
    first = blk.scale_byte_offset(2, 1, 0, heads - 1)
    assert [blk.scale_byte_offset(2, 1, o, heads - 1) - first for o in range(block_size)] == \
        list(range(0, 4 * block_size, 4))
    assert first >= 2 * blk.block_bytes + blk.kv_bytes + block_size * blk.slot_bytes
    # the scale views and code views address exactly what the reference readers read
    pool = make_pool(blk, 3)
    for kv, (codes, scales) in enumerate(zip(blk.code_views(pool), blk.scale_views(pool))):
        slots = torch.arange(3 * block_size)
        ref_codes, ref_scales = gather_rows(pool, blk, slots, kv)
        assert torch.equal(codes.reshape(-1, heads, head_size).view(torch.uint8),
                           ref_codes.view(torch.uint8))
        assert torch.equal(scales.reshape(-1, heads).view(torch.int32), ref_scales.view(torch.int32))


def test_placement_checks_and_contract():
    with pytest.raises(ValueError, match="kv_scale_placement"):
        KVLayout("int8_per_token_head", torch.float16, 2, 16, 8, "column")
    with pytest.raises(TypeError, match="kv_scale_placement"):
        KVLayout("int8_per_token_head", torch.float16, 2, 16, 8, 1)
    row = KVLayout("int8_per_token_head", torch.float16, 2, 16, 8)
    blk = KVLayout("int8_per_token_head", torch.float16, 2, 16, 8, "block")
    with pytest.raises(KVLayoutMismatchError, match="kv_scale_placement"):
        row.check_compatible(blk)
    # formats without scales: the placement changes nothing
    assert KVLayout("fp8", torch.float16, 2, 16, 8, "block").spec == KVLayout("fp8", torch.float16, 2, 16, 8).spec
    with pytest.raises(ValueError, match="scale region"):
        check_spec(dataclasses.replace(blk.spec, scale_offset=4))
    with pytest.raises(ValueError, match="placement"):
        check_spec(dataclasses.replace(blk.spec, placement=2))
    with pytest.raises(ValueError, match="kv_scale_placement"):
        CacheConfig(kv_scale_placement="rows")


# ---- kernels against references (interpreter) ----------------------------------------------------------------
@pytest.mark.parametrize("fmt,block_size,kv_heads,head_size", sample_cases(5, 6, PTH, [8, 16, 32], [1, 2, 4],
                                                                          [16, 32, 64]))
def test_write_block_placement_matches_reference(fmt, block_size, kv_heads, head_size):
    kv_cache_dtype, dtype = fmt
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, "block")
    num_tokens, num_blocks = 2 * block_size + 3, 5
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[::5] = -1
    key = (torch.randn(num_tokens, kv_heads, head_size) * 3).to(dtype)
    value = torch.randn(num_tokens, kv_heads, head_size).to(dtype)
    pool = make_pool(spec, num_blocks)
    expected = pool.clone()
    write_kv(key, value, pool, slots, spec)
    write_kv_reference(key, value, expected, slots, spec)
    assert torch.equal(pool, expected)
    # the same tokens written with the row placement dequantize to the same values
    row = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    row_pool = make_pool(row, num_blocks)
    write_kv_reference(key, value, row_pool, slots, row)
    kept = slots[slots >= 0]
    for kv in (0, 1):
        (c1, s1), (c2, s2) = gather_rows(pool, spec, kept, kv), gather_rows(row_pool, row, kept, kv)
        assert torch.equal(c1.view(torch.uint8), c2.view(torch.uint8)) and torch.equal(s1, s2)


DECODE = sample_cases(6, 6, PTH, [8, 16, 32], [(4, 4), (4, 2), (8, 2), (4, 1)], [16, 32, 64])


def _decode_args(fmt, block_size, heads, head_size, lens):
    """(q, pool, block tables, lengths, spec, sm_scale) of a block-placement pool holding `lens` tokens."""
    (kv_cache_dtype, dtype), (num_heads, kv_heads) = fmt, heads
    spec = make_spec(kv_cache_dtype, dtype, kv_heads, head_size, block_size, "block")
    tables, num_blocks = random_block_tables(lens, block_size)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, lens, dtype)
    q = torch.randn(len(lens), num_heads, head_size).to(dtype)
    return q, pool, tables, torch.tensor(lens, dtype=torch.int32), spec, head_size ** -0.5


@pytest.mark.parametrize("fmt,block_size,heads,head_size", DECODE)
def test_decode_block_placement_matches_reference(fmt, block_size, heads, head_size):
    dtype = fmt[1]
    args = _decode_args(fmt, block_size, heads, head_size, length_choices(block_size)[:4])
    torch.testing.assert_close(paged_decode_attention(*args).float(), paged_decode_attention_reference(*args).float(),
                               **attention_tolerance(dtype))


@pytest.mark.parametrize("f16", [False, True])
def test_decode_block_placement_split_paths(f16):
    """The GPU's split-K path (partials merged by a second kernel) and float16 dot products, forced in the
    interpreter."""
    lens = [1, 17, 40]
    spec = make_spec("int8_per_token_head", torch.float16, 2, 32, 16, "block")
    tables, num_blocks = random_block_tables(lens, 16)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, lens, torch.float16)
    q = torch.randn(3, 4, 32).to(torch.float16)
    args = (q, pool, tables, torch.tensor(lens, dtype=torch.int32), spec, 32 ** -0.5)
    cfg = dataclasses.replace(launch.decode_config(3, 2, 2, 32, 1, max(lens), q.device, fmt=spec.fmt,
                                                   placement=spec.placement),
                              num_splits=3, block_n=8, f16_dot=f16)
    torch.testing.assert_close(paged_decode_attention(*args, config=cfg).float(),
                               paged_decode_attention_reference(*args).float(), **attention_tolerance(torch.float16))


@pytest.mark.parametrize("fmt,causal", [(PTH[0], True), (PTH[3], False), (PTH[2], True)])
def test_paged_context_block_placement_matches_reference(fmt, causal):
    kv_cache_dtype, dtype = fmt
    q_lens, kv_lens = [1, 9, 5], ([1, 20, 40] if causal else [7, 33, 2])
    spec = make_spec(kv_cache_dtype, dtype, 2, 32, 8, "block")
    tables, num_blocks = random_block_tables(kv_lens, 8)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, kv_lens, dtype)
    q = torch.randn(sum(q_lens), 4, 32).to(dtype)
    args = (q, pool, tables, cu_seqlens(q_lens), torch.tensor(kv_lens, dtype=torch.int32), spec, causal, 32 ** -0.5)
    torch.testing.assert_close(paged_context_attention(*args).float(),
                               paged_context_attention_reference(*args).float(), **attention_tolerance(dtype))


# ---- heads above formats.V_TRANSPOSED_ABOVE: the block placement stores each block's V codes transposed ------
BIG = 2 * formats.V_TRANSPOSED_ABOVE


@pytest.mark.parametrize("kv_cache_dtype", ["int8_per_token_head", "fp8_per_token_head"])
def test_block_placement_stores_v_transposed_above_128(kv_cache_dtype):
    blk, row = (KVLayout(kv_cache_dtype, torch.float16, 2, BIG, 8, placement) for placement in ("block", "row"))
    pool, row_pool = make_pool(blk, 3, random_bytes=False), make_pool(row, 3, random_bytes=False)
    key, value = (torch.randn(1, 2, BIG) * 3).to(torch.float16), torch.randn(1, 2, BIG).to(torch.float16)
    slot = torch.tensor([8 + 5])                                             # block 1, slot 5
    write_kv(key, value, pool, slot, blk)
    write_kv_reference(key, value, row_pool, slot, row)
    for kv in (0, 1):
        want = gather_rows(row_pool, row, slot, kv)[0][0].view(torch.uint8)    # [heads, BIG]
        d = torch.arange(BIG)
        at = [kv * blk.kv_bytes + h * BIG + 5 * blk.slot_bytes + d if kv == 0 else       # K: rows, as ever
              blk.kv_bytes + h * BIG * 8 + d * 8 + 5 for h in range(2)]            # V: [head, d, slot] per block
        assert torch.equal(torch.stack([pool[1][i] for i in at]), want)
        assert torch.equal(blk.code_views(pool)[kv][1, 5].view(torch.uint8), want)
    # up to 128 the block placement's V rows stay rows
    small = KVLayout(kv_cache_dtype, torch.float16, 2, formats.V_TRANSPOSED_ABOVE, 8, "block")
    assert addressing.v_element_strides(small.spec)[2] == 1


# (format, block size, (query heads, kv heads), window, tokens per tile, splits, float16 dots): tiles shorter than a
# block, windows that start inside a block, splits; the pools hold random bytes (NaN codes too) past every length
TRANSPOSED = [(PTH[0], 16, (4, 1), 0, 32, 1, False), (PTH[2], 8, (8, 2), 0, 16, 3, True),
              (PTH[3], 32, (4, 1), 0, 16, 2, False), (PTH[1], 16, (2, 1), 20, 16, 2, False),
              (PTH[2], 16, (4, 1), 13, 32, 3, True)]


@pytest.mark.parametrize("fmt,block_size,heads,window,block_n,splits,f16", TRANSPOSED)
def test_decode_transposed_v_matches_reference(fmt, block_size, heads, window, block_n, splits, f16):
    (num_heads, kv_heads), dtype = heads, fmt[1]
    lens = [1, block_size - 1, 3 * block_size + 5, 2 * block_size]
    args = _decode_args(fmt, block_size, heads, BIG, lens)
    cfg = dataclasses.replace(launch.decode_config(len(lens), kv_heads, num_heads // kv_heads, BIG, 1, max(lens),
                                                   args[0].device, fmt=args[4].fmt, placement=args[4].placement),
                              block_n=block_n, num_splits=splits, f16_dot=f16)
    torch.testing.assert_close(paged_decode_attention(*args, sliding_window=window, config=cfg).float(),
                               paged_decode_attention_reference(*args, sliding_window=window).float(),
                               **attention_tolerance(dtype))


@pytest.mark.parametrize("fmt,causal,window,block_n", [(PTH[0], True, 0, 16), (PTH[3], False, 0, 32),
                                                       (PTH[2], True, 11, 16), (PTH[1], True, 0, 64)])
def test_paged_context_transposed_v_matches_reference(fmt, causal, window, block_n):
    kv_cache_dtype, dtype = fmt
    q_lens, kv_lens = [1, 9, 5], ([1, 20, 45] if causal else [7, 33, 2])
    spec = make_spec(kv_cache_dtype, dtype, 2, BIG, 16, "block")
    tables, num_blocks = random_block_tables(kv_lens, 16)
    pool = make_pool(spec, num_blocks)
    fill_sequences(pool, spec, tables, kv_lens, dtype)
    q = torch.randn(sum(q_lens), 4, BIG).to(dtype)
    args = (q, pool, tables, cu_seqlens(q_lens), torch.tensor(kv_lens, dtype=torch.int32), spec, causal, BIG ** -0.5)
    torch.testing.assert_close(
        paged_context_attention(*args, sliding_window=window, config=launch.ContextConfig(16, block_n)).float(),
        paged_context_attention_reference(*args, sliding_window=window).float(), **attention_tolerance(dtype))


# ---- defect A with the block placement (engine level, torch backend) ----------------------------------------
def test_scale_wipe_reproduces_with_block_placement():
    task = minikv.tasks.for_model("tiny-gemma4")
    prompts = task.prompts(6, seed=0)

    def run(**kw):
        llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=4,
                         backend="torch", **kw)
        outs = llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
        llm.arena.check()
        return llm, [o.text for o in outs]

    _, clean = run()                                            # row placement, fixed
    llm, fixed = run(kv_scale_placement="block")
    assert llm.kv_layout.scale_placement == "block" and llm.kv_layout.row_bytes % 16 == 0
    _, buggy = run(kv_scale_placement="block", reintroduce=("scale-wipe",))
    damaged = [i for i, (p, t) in enumerate(zip(prompts, buggy)) if t != fixed[i] and not task.check(p, t)]
    assert damaged == [0, 1, 2, 3]                              # the first batch, as with vLLM's row layout
    assert buggy[4:] == fixed[4:]
    assert fixed == clean           # same codes and scales, other addresses: the same tokens as vLLM's row layout


def test_encoder_decoder_runs_with_block_placement():
    """The cross backend is told the scale placement too, so the layout contract holds and tokens match "row"."""
    import minikv
    prompts = ["abcdef", "hello9"]
    outs = {}
    for placement in ("row", "block"):
        llm = minikv.LLM(model="tiny-t5", kv_cache_dtype="int8_per_token_head", backend="torch",
                         kv_scale_placement=placement)
        outs[placement] = [o.token_ids for o in llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=8))]
    assert outs["row"] == outs["block"]
