"""How big the KV cache is: pool sizes in blocks and max_model_len, from a memory budget or from num_blocks.

The budget: `kv_cache_memory_bytes`, else on CUDA `gpu_memory_utilization` of the device less the weights and a
profiled activation peak, else on CPU `DEFAULT_CPU_KV_CACHE_BYTES`. The self pools get it less the cross pools, at
most what max_num_seqs requests of max_model_len fill; the config's length only caps max_model_len (docs/memory.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minikv.kernels.errors import InvalidValueError

# The KV-cache budget on CPU when none is given (vLLM's CPU backend takes a KV-cache space the same way).
DEFAULT_CPU_KV_CACHE_BYTES = 64 * 2**20


class MaxModelLenError(InvalidValueError):
    """A request, or max_model_len itself, is longer than the engine's max_model_len or cache allows."""


class CacheBudgetError(InvalidValueError, MemoryError):
    """The KV-cache budget holds not one block (a ValueError, and a MemoryError for code that catches that)."""


@dataclass(frozen=True)
class CacheSize:
    num_blocks: int             # blocks of every self-attention pool
    num_cross_blocks: int       # blocks of every cross pool (0 without cross attention)
    max_model_len: int          # the longest sequence (prompt + generated) a request may reach
    budget_bytes: int | None    # the budget the pools were sized from; None when num_blocks was given
    budget_source: str          # what decided the size, as an error message names it


def _fmt(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:.2f} GiB"


def parse_bytes(text: str) -> int:
    """'67108864', '64MiB', '64MB', '1GiB', '512k' as a byte count (binary units: k/M/G mean KiB/MiB/GiB)."""
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    s = str(text).strip().lower().removesuffix("b").removesuffix("i")
    num, unit = (s[:-1], s[-1]) if s and s[-1] in "kmgt" else (s, "")
    try:
        value = float(num)
    except ValueError:
        raise InvalidValueError(f"{text!r} is not a byte count: give an integer of bytes or a size such as 64MiB "
                                f"or 1GiB") from None
    if value <= 0 or not math.isfinite(value):
        raise InvalidValueError(f"a KV-cache budget must be positive, got {text!r}")
    return int(value * units[unit])


def available_host_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


PROFILE_ROW = 2048          # tokens per row of the profiling forward (profile_activations)


@torch.inference_mode()
def profile_activations(model, device: torch.device, sched) -> int:
    """CUDA: the activation peak of a dense forward of the largest prefill, as vLLM profiles it."""
    mc = model.config
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    if mc.is_encoder_decoder:
        width = min(sched.max_num_batched_tokens // sched.max_num_seqs or 1, mc.max_encoder_len)
        ids = torch.zeros(sched.max_num_seqs, width, dtype=torch.long, device=device)
        model.encode(ids, torch.ones_like(ids, dtype=torch.bool))
    else:
        # The step's tokens in rows of at most PROFILE_ROW: the MLPs' activations are the whole step's, while the
        # dense attention's mask (which the engine's kernels never build) stays small; one row of 65,536 tokens
        # would ask for a 128 GiB mask.
        n = min(sched.max_num_batched_tokens, mc.max_position)
        width = min(n, sched.max_model_len or n, PROFILE_ROW)
        model(torch.zeros(max(1, n // width), width, dtype=torch.long, device=device))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    return max(peak, 0)


def cuda_budget(device: torch.device, utilization: float, activation_bytes: int) -> int:
    """vLLM's rule: the share `utilization` of the device's memory, less what this process already holds (the
    weights) and the activation peak a profiling forward measured."""
    total = torch.cuda.get_device_properties(device).total_memory
    held = torch.cuda.memory_reserved(device)
    return int(utilization * total) - held - activation_bytes


def size_cache(*, block_bytes: int, cross_block_bytes: int, block_size: int, max_num_seqs: int,
               config_len: int, encoder_len: int, num_blocks: int | None, cross_pool_blocks: int | None,
               max_model_len: int | None, budget_bytes: int | None, budget_source: str) -> CacheSize:
    """The pools' sizes. `block_bytes`: one block of every self pool together; `cross_block_bytes`: of every cross
    pool (0 without cross attention); `budget_bytes` is ignored when `num_blocks` is given."""
    if max_model_len is not None and max_model_len > config_len:
        raise MaxModelLenError(f"max_model_len={max_model_len} is longer than the model's context length "
                               f"{config_len} (its config's max_position_embeddings); give max_model_len <= "
                               f"{config_len}, or leave it out")
    per_enc = math.ceil(max(encoder_len, 1) / block_size)
    cross = (cross_pool_blocks or max_num_seqs * per_enc) if cross_block_bytes else 0
    if num_blocks is not None:
        pool_blocks, source = num_blocks, f"num_blocks={num_blocks}"
    else:
        left = budget_bytes - cross * cross_block_bytes
        pool_blocks, source = max(left, 0) // block_bytes, budget_source
        if pool_blocks < 1:
            raise CacheBudgetError(f"the KV-cache budget ({budget_source}: {_fmt(max(budget_bytes, 0))}) holds no "
                              f"block of {_fmt(block_bytes)}"
                              + (f" after the cross pools ({_fmt(cross * cross_block_bytes)})" if cross else "")
                              + "; raise kv_cache_memory_bytes (CLI --kv-cache-memory-bytes) or, on CUDA, "
                                "gpu_memory_utilization, or give num_blocks")
    holds = pool_blocks * block_size
    if max_model_len is None:
        max_model_len = min(config_len, holds)
    elif max_model_len > holds:
        raise MaxModelLenError(f"max_model_len={max_model_len} tokens does not fit the KV cache: {source} holds "
                               f"{pool_blocks} blocks of {block_size} tokens = {holds} tokens; lower max_model_len "
                               f"to at most {holds}, or raise the cache (kv_cache_memory_bytes, gpu_memory_utilization on CUDA, or num_blocks)")
    if num_blocks is None:
        pool_blocks = min(pool_blocks, max_num_seqs * math.ceil(max_model_len / block_size))
    return CacheSize(pool_blocks, cross, max_model_len, None if num_blocks is not None else budget_bytes, source)
