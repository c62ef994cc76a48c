"""Attention backends for kernels that are not minikv's, one file per adapter (minikv.attention.protocol.Adapter):
get("flexattention") (torch's FlexAttention over the pool's pages, CPU and CUDA), get("sdpa") (torch's
scaled_dot_product_attention over each request's gathered pages), get("flashinfer") (FlashInfer's paged decode and
prefill wrappers, CUDA). Each is an optional extra (pyproject.toml); a missing package is a one-line
MissingBackendError naming it.
"""
from __future__ import annotations

import importlib

NAMES = ("flexattention", "sdpa", "flashinfer")
_MODULES = {"flexattention": "flex", "sdpa": "sdpa", "flashinfer": "flashinfer"}


class MissingBackendError(ImportError):
    """The package an adapter wraps is not installed (the message names it)."""


def get(name: str):
    """A new instance of the adapter called `name` (one of NAMES)."""
    if name not in _MODULES:
        raise KeyError(f"unknown attention backend {name!r}; the adapters are {', '.join(NAMES)}")
    module = importlib.import_module(f"{__name__}.{_MODULES[name]}")
    return module.Backend()
