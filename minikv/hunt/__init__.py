"""minikv.hunt: a differential tester that searches engine configurations for violated KV-cache invariants.
See docs/internals.md#hunt."""
from __future__ import annotations

from .oracles import ORACLES, Violation
from .record import KVRow, RequestResult, Run, StrayWrite
from .scenario import Request, Scenario

# hypothesis is imported only with the search itself, so `import minikv.hunt` (and the CLI's parser) work without it.
_LAZY = {"hunt": "search", "HuntReport": "search", "Finding": "search", "MinikvEngine": "minikv_engine",
         "replay": "minikv_engine", "hunt_backend": "backend_hunt", "BackendReport": "backend_hunt"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"minikv.hunt.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'minikv.hunt' has no attribute {name!r}")


__all__ = ["ORACLES", "BackendReport", "Finding", "HuntReport", "KVRow", "MinikvEngine", "Request", "RequestResult", "Run", "Scenario",
           "StrayWrite", "Violation", "hunt", "hunt_backend", "replay"]
