"""Launch configurations per device: tile sizes, program counts, warps and pipeline stages for each kernel, and
programmatic dependent launch. See docs/internals.md#kernels-launch."""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import formats
from .mode import INTERPRETED

# Largest tile (elements) an interpreted program handles at once; numpy is fast at this size.
CPU_TILE_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class WriteConfig:
    block_t: int          # tokens per program
    block_h: int          # kv heads per program (all of them, padded to a power of two)
    num_warps: int = 4


@dataclass(frozen=True)
class DecodeConfig:
    block_g: int          # query heads of one GQA group, padded (>= 16 on GPU for tl.dot)
    block_n: int          # tokens per tile
    num_splits: int       # programs sharing one sequence's tokens (split-K); 1 = no partials, no merge
    num_warps: int = 4
    num_stages: int = 2   # tiles in flight: the software pipeline's depth (shared-memory buffers per operand)
    f16_dot: bool = False          # 1-byte formats, 16-bit q: float16 dot products (q rescaled by a power of two)
    convert_asm: bool = False      # 1-byte codes to float16 with inline PTX (int8 bit trick, packed e4m3; GPU only)
    k_pure: bool = True            # let the compiler place K's conversion (see decode_attention._codes_to)
    v_pure: bool = False           # ... and V's (it then reads V from shared memory byte by byte, no f16 copy)
    max_registers: int | None = None   # a cap on registers per thread (more programs per SM), or the compiler's
    row_window: bool = True        # "row" placement: aligned 16-byte reads where strides allow (row_window_period)


@dataclass(frozen=True)
class ContextConfig:
    block_m: int          # rows per program: (query, head-of-group) pairs
    block_n: int          # keys per tile
    num_warps: int = 4
    num_stages: int = 2
    f16_dot: bool = False  # paged 1-byte formats, 16-bit q: float16 dot products (q rescaled by a power of two)


@dataclass(frozen=True)
class MatmulConfig:
    block_m: int          # rows (all of them, padded to a power of two, >= 16 for tl.dot)
    block_n: int          # output columns per program
    block_k: int          # the reduction's tile
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class NormConfig:
    block_r: int          # rows per program
    block_d: int          # the row's length, padded to a power of two
    num_warps: int = 4


def _pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


@functools.cache
def num_sms(device_index: int = 0) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _dependent_launch() -> bool:
    """Programmatic dependent launch (docs/internals.md#kernels-launch): MINIKV_PDL=0 or 1, else sm_90 and newer."""
    if INTERPRETED or not hasattr(tl.extra.cuda, "gdc_wait"):      # no griddepcontrol before Triton 3.4
        return False
    env = os.environ.get("MINIKV_PDL")
    return env == "1" or env != "0" and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


PDL: bool = _dependent_launch()
PDL_LAUNCH: dict = {"launch_pdl": True} if PDL else {}       # a launch's keywords: older Tritons refuse launch_pdl
_PDL: tl.constexpr = tl.constexpr(PDL)


@triton.jit
def wait_for_inputs():
    """First in every kernel launched with PDL_LAUNCH: wait until the kernel before it has finished and its
    stores are visible, then let the next kernel be scheduled (no-op where PDL is off)."""
    if _PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def dot_in_float32(dtype: torch.dtype) -> bool:
    """Whether attention feeds tl.dot float32 tiles: always in the interpreter, else only for float32 models."""
    return INTERPRETED or dtype == torch.float32


def write_config(num_tokens: int, num_heads: int, head_size: int) -> WriteConfig:
    block_h = _pow2(num_heads)
    per_token = block_h * head_size
    if INTERPRETED:
        return WriteConfig(block_t=min(_pow2(num_tokens), max(1, CPU_TILE_ELEMENTS // per_token)), block_h=block_h)
    return WriteConfig(block_t=min(_pow2(num_tokens), max(1, 4096 // per_token)), block_h=block_h, num_warps=4)


def norm_config(rows: int, d: int) -> NormConfig:
    """kernels/rms_norm.py: on a GPU about 4,096 elements per program; interpreted, as many rows as one tile."""
    block_d = _pow2(d)
    if INTERPRETED:
        return NormConfig(block_r=min(_pow2(rows), max(1, CPU_TILE_ELEMENTS // block_d)), block_d=block_d)
    block_r = max(1, min(_pow2(rows), 4096 // block_d))
    return NormConfig(block_r=block_r, block_d=block_d, num_warps=4 if block_r * block_d <= 4096 else 8)


# kernels/decode_matmul.py at gemma-4-E2B's shapes, 64 rows, on an H100 (results/gpu/decode-matmul-2026-12-06/): 16
# columns, K tiles of 128, 3 stages for a wide product (6,144 columns), 4 for two narrow weights, 5 for one.
MATMUL_MAX_ROWS = 64
MATMUL_TILE = (16, 128)
MATMUL_WIDE = 2048


def matmul_config(m: int, n: int, k: int, dtype: torch.dtype, weights: int = 2) -> MatmulConfig | None:
    """kernels/decode_matmul.py's configuration (`weights`: 2 for up= and pair=, else 1), or None: more rows than a
    decode batch, float32 (tl.dot would take TF32), or a shape the tiles do not divide."""
    block_m = max(16, _pow2(m))
    if INTERPRETED:                         # the largest tiles up to 64 that divide the shape (tl.dot: >= 16)
        block_n, block_k = min(n & -n, 64), min(k & -k, 64)
        if min(block_n, block_k) < 16:
            return None
    elif m > MATMUL_MAX_ROWS or dtype == torch.float32:
        return None
    else:
        block_n, block_k = MATMUL_TILE
    if n % block_n or k % block_k:
        return None
    stages = 3 if n >= MATMUL_WIDE else 4 if weights == 2 else 5
    return MatmulConfig(block_m, block_n, block_k, num_stages=stages)


# Decode on a GPU: sized from the machine, each choice the fastest measured on an NVIDIA H200 (docs/internals.md).
DECODE_TILE_BYTES = 16384
DECODE_MAX_TOKENS = 128
DECODE_PROGRAMS_PER_SM = 4
DECODE_WAVES = 1.0
DECODE_MIN_TILES = 2
DECODE_MAX_SPLITS = 64
DECODE_STAGES = {1: 5, 2: 3, 4: 3}           # by bytes per element
# Head sizes above 128, 1- and 2-byte formats, measured at gemma-4-E2B's shapes (docs/internals.md): (block_n, stages)
DECODE_LARGE_HEAD = {"row placement": (32, 3), "block placement": (32, 5), "other": (32, 4)}
DECODE_LARGE_HEAD_PROGRAMS_PER_SM = 2
# Head sizes up to 128, per-token-head formats in the "row" placement: (block_n, stages, max_registers), the cap for
# four programs per SM, not two (10-15% faster on an H100: results/gpu/decode-instructions-2026-12-07-h100/).
DECODE_ROW_SCALES = (64, 4, 128)


def decode_splits(batch: int, num_kv_heads: int, max_len: int, block_n: int, sms: int,
                  programs_per_sm: int = DECODE_PROGRAMS_PER_SM) -> int:
    """Programs per (sequence, kv head): DECODE_WAVES rounds of all SMs' slots, DECODE_MIN_TILES tiles each."""
    programs = batch * num_kv_heads
    wanted = round(DECODE_WAVES * sms * programs_per_sm / programs)
    return max(1, min(wanted, max_len // (DECODE_MIN_TILES * block_n), DECODE_MAX_SPLITS))


def decode_config(batch: int, num_kv_heads: int, group: int, head_size: int, elem_bytes: int, max_len: int,
                  device: torch.device, fmt: int | None = None, placement: int = formats.ROW,
                  sms: int | None = None) -> DecodeConfig:
    """`max_len`: the longest sequence (CPU) or what the block table can hold (GPU, no host sync)."""
    if INTERPRETED:
        block_n = min(_pow2(max_len), max(16, CPU_TILE_ELEMENTS // head_size // 4))
        # row_window off: the recorded CPU outputs keep their summation order (the tests turn it on)
        return DecodeConfig(block_g=_pow2(group), block_n=block_n, num_splits=1, row_window=False)
    block_g = max(16, _pow2(group))
    sms = sms or num_sms(device.index or 0)
    one_byte = elem_bytes == 1
    row_scales = fmt is not None and formats.has_inline_scales(fmt) and placement == formats.ROW
    max_registers = None
    if head_size > 128 and elem_bytes <= 2:
        block_n, stages = DECODE_LARGE_HEAD["row placement" if row_scales else "block placement"
                                            if placement == formats.BLOCK else "other"]
        splits = decode_splits(batch, num_kv_heads, max_len, block_n, sms, DECODE_LARGE_HEAD_PROGRAMS_PER_SM)
    else:
        block_n = max(16, min(DECODE_MAX_TOKENS, DECODE_TILE_BYTES // (head_size * elem_bytes)))
        stages = DECODE_STAGES[elem_bytes]
        if row_scales and one_byte:
            block_n, stages, max_registers = DECODE_ROW_SCALES
        splits = decode_splits(batch, num_kv_heads, max_len, block_n, sms)
    return DecodeConfig(block_g=block_g, block_n=block_n, num_splits=splits, num_warps=4, num_stages=stages,
                        f16_dot=one_byte, convert_asm=one_byte, max_registers=max_registers)


# Context launch configurations measured on an NVIDIA H200 (bf16, head size 128; docs/internals.md).
CONTEXT_LONG_128 = (128, 128, 8, 3)
CONTEXT_LONG_128_ONE_BYTE = (256, 64, 8, 3)
CONTEXT_SHORT_128 = (128, 4, 3)
SHORT_ROWS = 64
# Head sizes 256 and 512, measured at gemma-4-E2B's prefill on an NVIDIA H100 (8 query heads over 1 KV head,
# 8 prompts of 2,048 tokens and one of 32,768; docs/internals.md): (block_m, block_n, num_warps, num_stages).
CONTEXT_LONG_256 = (128, 64, 8, 2)
CONTEXT_LONG_256_ONE_BYTE = (128, 32, 8, 2)
CONTEXT_LONG_512 = (32, 32, 4, 2)          # either cache width; 1-byte caches take float16 dot products


def context_config(head_size: int, dtype: torch.dtype, max_rows: int | None = None,
                   max_kv_len: int | None = None, rows_per_seq: float | None = None,
                   one_byte_cache: bool = False) -> ContextConfig:
    """The context attention kernel's launch configuration for this device and shape."""
    if INTERPRETED:
        block_m = min(_pow2(max_rows or 1), 512)
        block_n = min(_pow2(max_kv_len or 1), 256, max(16, 2 * CPU_TILE_ELEMENTS // block_m))
        return ContextConfig(block_m=block_m, block_n=block_n)
    if head_size > 256:
        if dtype == torch.float32:     # sized for shared memory, not measured for speed
            return ContextConfig(block_m=16, block_n=16, num_warps=4, num_stages=1)
        return ContextConfig(*CONTEXT_LONG_512, f16_dot=one_byte_cache)
    if dtype == torch.float32:
        return ContextConfig(block_m=64, block_n=32 if head_size <= 128 else 16, num_warps=4, num_stages=2)
    if head_size <= 128 and rows_per_seq is not None and rows_per_seq <= SHORT_ROWS:
        block_n, warps, stages = CONTEXT_SHORT_128
        return ContextConfig(block_m=max(16, _pow2(math.ceil(rows_per_seq))), block_n=block_n, num_warps=warps,
                             num_stages=stages, f16_dot=one_byte_cache)
    if head_size <= 64:
        return ContextConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)
    if head_size <= 128:
        return ContextConfig(*(CONTEXT_LONG_128_ONE_BYTE if one_byte_cache else CONTEXT_LONG_128))
    tile = CONTEXT_LONG_256_ONE_BYTE if one_byte_cache else CONTEXT_LONG_256
    return ContextConfig(*tile, f16_dot=one_byte_cache)
