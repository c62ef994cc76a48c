"""Attention backends: the set of kernel ops an attention impl calls, Triton or the pure-PyTorch references.

Both backends take the same arguments and address the cache with the same bytes, so `backend="torch"` is a
drop-in check of `backend="triton"`. The engine calls the ops with `validate=False`: per-step input checks would
cost host syncs, and the arena's guard canaries are the engine's safety net.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KernelOps:
    name: str
    write_kv: Callable             # (key, value, pool, slot_mapping, spec, k_scale, v_scale, validate)
    decode: Callable               # paged decode attention
    context: Callable              # unfused context attention: K/V from the workspace
    paged_context: Callable        # fused context attention: K/V read back from the paged cache
    # Held around a layer's kernel calls: the Triton interpreter patches triton.language process-wide while it
    # runs a kernel, so engines in different threads take turns (compiled kernels and the references need not).
    lock: AbstractContextManager = field(default_factory=contextlib.nullcontext)


_INTERPRETER_LOCK = threading.Lock()


def get_ops(name: str) -> KernelOps:
    """The kernel ops of backend `name` ("triton" or "torch", minikv.config.BACKENDS; checked there)."""
    from minikv import kernels as k
    if name == "triton":
        lock = _INTERPRETER_LOCK if k.mode.INTERPRETED else contextlib.nullcontext()
        return KernelOps("triton", k.write_kv, k.paged_decode_attention, k.context_attention,
                         k.paged_context_attention, lock)
    if name != "torch":
        raise KeyError(name)
    return KernelOps("torch", k.write_kv_reference, k.paged_decode_attention_reference,
                     k.context_attention_reference, k.paged_context_attention_reference)
