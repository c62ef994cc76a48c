"""Attention backends: the set of kernel ops an attention impl calls, Triton or the pure-PyTorch references.

Both backends take the same arguments and address the cache with the same bytes, so `backend="torch"` is a
drop-in check of `backend="triton"`. The engine calls the ops with `validate=False`: per-step input checks would
cost host syncs, and the arena's guard canaries are the engine's safety net.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelOps:
    name: str
    write_kv: Callable             # (key, value, pool, slot_mapping, spec, k_scale, v_scale, validate)
    decode: Callable               # paged decode attention
    context: Callable              # unfused context attention: K/V from the workspace
    paged_context: Callable        # fused context attention: K/V read back from the paged cache


# The Triton interpreter patches triton.language process-wide while it runs a kernel, so two threads cannot
# interpret kernels at once; engines in different threads take turns per kernel call (compiled kernels need not).
_INTERPRETER_LOCK = threading.Lock()


def _one_interpreter_at_a_time(op: Callable) -> Callable:
    @functools.wraps(op)
    def locked(*args, **kwargs):
        with _INTERPRETER_LOCK:
            return op(*args, **kwargs)
    return locked


def get_ops(name: str) -> KernelOps:
    """The kernel ops of backend `name` ("triton" or "torch", minikv.config.BACKENDS; checked there)."""
    from minikv import kernels as k
    if name == "triton":
        ops = (k.write_kv, k.paged_decode_attention, k.context_attention, k.paged_context_attention)
        if k.mode.INTERPRETED:
            ops = tuple(_one_interpreter_at_a_time(op) for op in ops)
        return KernelOps("triton", *ops)
    if name != "torch":
        raise KeyError(name)
    return KernelOps("torch", k.write_kv_reference, k.paged_decode_attention_reference,
                     k.context_attention_reference, k.paged_context_attention_reference)
