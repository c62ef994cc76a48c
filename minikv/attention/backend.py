"""Attention backends: the set of kernel ops an attention impl calls, Triton or the pure-PyTorch references
(each an instance of minikv.attention.protocol.AttentionBackend; foreign kernels: minikv.attention.backends).

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

from minikv.attention.protocol import Features


@dataclass(frozen=True)
class KernelOps:
    name: str
    write_kv: Callable             # (key, value, pool, slot_mapping, spec, k_scale, v_scale, validate)
    decode: Callable               # paged decode attention
    context: Callable              # unfused context attention: K/V from the workspace
    paged_context: Callable        # fused context attention: K/V read back from the paged cache
    features: Features = field(default_factory=Features)
    # Held around a layer's kernel calls: the Triton interpreter patches triton.language process-wide while it
    # runs a kernel, so engines in different threads take turns (compiled kernels and the references need not).
    lock: AbstractContextManager = field(default_factory=contextlib.nullcontext)


_INTERPRETER_LOCK = threading.Lock()


def get_ops(name):
    """The kernel ops of backend `name` ("triton" or "torch", minikv.config.BACKENDS; checked there), of the
    adapter called `name` (minikv.attention.backends), or `name` itself when it is a backend object."""
    from minikv import kernels as k
    if not isinstance(name, str):
        return name
    from minikv.attention import backends
    if name in backends.NAMES:
        return backends.get(name)
    if name == "triton":
        if k.mode.INTERPRETED and k.mode.interpreter_problem():
            raise k.KernelModeError(k.mode.interpreter_problem())
        lock = _INTERPRETER_LOCK if k.mode.INTERPRETED else contextlib.nullcontext()
        return KernelOps("triton", k.write_kv, k.paged_decode_attention, k.context_attention,
                         k.paged_context_attention, lock=lock)
    if name != "torch":
        raise KeyError(name)
    return KernelOps("torch", k.write_kv_reference, k.paged_decode_attention_reference,
                     k.context_attention_reference, k.paged_context_attention_reference)
