"""Shared test fixtures and helpers: seeding, cache specs, pools, paged sequences, deterministic case sampling.

Test modules import the helpers with `from conftest import ...` (pytest puts tests/ on sys.path).
"""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from minikv.cache.layout import KVLayout
from minikv.kernels import write_kv_reference

# The tensors here are tiny: one thread beats two (thread hand-offs dominate), and a busy machine hurts less.
torch.set_num_threads(1)

# (kv_cache_dtype, model dtype) pairs the CPU interpreter can run: no bfloat16 there.
CPU_FORMATS = [("auto", torch.float16), ("auto", torch.float32), ("fp8", torch.float16), ("fp8", torch.float32),
               ("int8_per_token_head", torch.float16), ("int8_per_token_head", torch.float32),
               ("fp8_per_token_head", torch.float16), ("fp8_per_token_head", torch.float32)]
# (num_q_heads, num_kv_heads): MHA, GQA 2:1, GQA 4:1, MQA
HEAD_LAYOUTS = [(4, 4), (4, 2), (8, 2), (4, 1)]
HEAD_SIZES = [16, 32, 64]
BLOCK_SIZES = [8, 16, 32]


@pytest.fixture(autouse=True)
def _seed_everything():
    random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test, restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sample_cases(seed: int, n: int, *axes) -> list[tuple]:
    """n deterministic points of the product of `axes` in which every value of every axis appears.

    Each axis contributes its values in shuffled rounds (so each shows up at least n // len(axis) times), and the
    axes are combined in independent random orders; duplicates are replaced by fresh random points."""
    space_size = 1
    for axis in axes:
        space_size *= len(axis)
    if n >= space_size:
        return list(itertools.product(*axes))
    rng = random.Random(seed)
    columns = []
    for axis in axes:
        column = []
        while len(column) < n:
            column += rng.sample(list(range(len(axis))), len(axis))
        columns.append(column[:n])
    cases, seen = [], set()
    for i in range(n):
        index = tuple(column[i] for column in columns)
        while index in seen:
            index = tuple(rng.randrange(len(axis)) for axis in axes)
        seen.add(index)
        cases.append(tuple(axis[j] for axis, j in zip(axes, index)))
    return cases


def make_spec(kv_cache_dtype: str, model_dtype: torch.dtype, num_kv_heads: int, head_size: int,
              block_size: int, scale_placement: str = "row") -> KVLayout:
    return KVLayout(kv_cache_dtype, model_dtype, num_kv_heads, head_size, block_size, scale_placement)


def make_pool(spec: KVLayout, num_blocks: int, device="cpu", random_bytes: bool = True) -> torch.Tensor:
    """A [num_blocks, block_bytes] pool, filled with random bytes (so unwritten rows are visible) or zeros."""
    shape = (num_blocks, spec.block_bytes)
    if not random_bytes:
        return torch.zeros(shape, dtype=torch.uint8, device=device)
    gen = torch.Generator().manual_seed(1234)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).to(device)


def length_choices(block_size: int) -> list[int]:
    """Lengths that hit the edges: 1, one block -1/0/+1, several blocks +-1."""
    return [1, block_size - 1, block_size, block_size + 1, 3 * block_size - 1, 3 * block_size + 1]


def random_block_tables(lens: list[int], block_size: int, spare_blocks: int = 3, device="cpu"):
    """(block_tables int32 [B, max_blocks], num_blocks): each sequence gets distinct blocks in a random order.

    Unused entries hold -1 (the kernels must never read them)."""
    need = [max(1, -(-n // block_size)) for n in lens]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks).tolist()
    width = max(need) + 1
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    cursor = 0
    for b, count in enumerate(need):
        table[b, :count] = torch.tensor(perm[cursor:cursor + count], dtype=torch.int32)
        cursor += count
    return table.to(device), num_blocks


def fill_sequences(pool: torch.Tensor, spec: KVLayout, block_tables: torch.Tensor, lens: list[int],
                   model_dtype: torch.dtype, k_scale: float = 1.0, v_scale: float = 1.0,
                   magnitude: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Write random K/V for each sequence's first lens[b] tokens through the reference writer.

    Returns the K and V written, flattened [sum(lens), H, D] in `model_dtype` (for unfused comparisons)."""
    device = pool.device
    total = sum(lens)
    k = (torch.randn(total, spec.num_kv_heads, spec.head_size) * magnitude).to(model_dtype).to(device)
    v = (torch.randn(total, spec.num_kv_heads, spec.head_size) * magnitude).to(model_dtype).to(device)
    slots = []
    for b, n in enumerate(lens):
        tok = torch.arange(n, device=device)
        slots.append(block_tables[b].to(torch.int64)[tok // spec.block_size] * spec.block_size
                     + tok % spec.block_size)
    write_kv_reference(k, v, pool, torch.cat(slots), spec, k_scale, v_scale)
    return k, v


def cu_seqlens(lens: list[int], device="cpu") -> torch.Tensor:
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def attention_tolerance(dtype: torch.dtype) -> dict:
    return {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=1e-2, rtol=1e-2),
            torch.bfloat16: dict(atol=4e-2, rtol=4e-2)}[dtype]
