"""Attention backends: the set of kernel ops an attention impl calls, Triton or the pure-PyTorch references.

Both backends take the same arguments and address the cache with the same bytes, so `backend="torch"` is a
drop-in check of `backend="triton"`. The engine calls the ops with `validate=False`: per-step input checks would
cost host syncs, and the arena's guard canaries are the engine's safety net.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

BACKENDS = ("triton", "torch")


@dataclass(frozen=True)
class KernelOps:
    name: str
    write_kv: Callable             # (key, value, pool, slot_mapping, spec, k_scale, v_scale, validate)
    decode: Callable               # paged decode attention
    context: Callable              # unfused context attention: K/V from the workspace
    paged_context: Callable        # fused context attention: K/V read back from the paged cache


def get_ops(name: str) -> KernelOps:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    from minikv import kernels as k
    if name == "triton":
        return KernelOps("triton", k.write_kv, k.paged_decode_attention, k.context_attention,
                         k.paged_context_attention)
    return KernelOps("torch", k.write_kv_reference, k.paged_decode_attention_reference,
                     k.context_attention_reference, k.paged_context_attention_reference)
