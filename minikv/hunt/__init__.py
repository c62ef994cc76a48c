"""minikv.hunt: a differential tester that searches engine configurations for violated KV-cache invariants.

    from minikv.hunt import hunt
    report = hunt(budget_s=60)                               # the fixed engine: expect "clean"
    report = hunt(reintroduce=("NAME",), budget_s=120)       # the tuple goes to every LLM(...) unread
    report = hunt(model="path/to/checkpoint")                # a user's transformers-format directory
    print(report.text())                                     # the invariant, the shrunk scenario, its repro
    report.to_dict()                                         # the same as JSON-ready data (`--results`)

The hunter knows invariants, not defects. It generates configurations with hypothesis (strategies.py), runs each
on the engine (minikv_engine.py, or another engine's adapter with the same `run(scenario) -> Run`), checks the
oracles (oracles.py) against the run's records (record.py) and a dense reference (reference.py), and shrinks a
failure to a minimal scenario printed as a ready-to-run `minikv.LLM(...)` reproduction that checks the invariant
itself and exits 1 (repro.py; `replay`, in minikv_engine.py, runs a scenario through the adapter and oracles).
figure.py draws the search map.
`minikv hunt` is its command line (cli.py); docs/hunt.md is the guide. `hunt_backend` (backend_hunt.py) hunts one
attention backend alone over kernel-level families (families.py, kernel_case.py; docs/backends.md).
"""
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
