"""Benchmarks, run as `python -m minikv.bench <name> [options]`.

COMMANDS maps each benchmark name to a function taking the remaining command-line arguments; each benchmark
lives in its own module (with a `main(argv)`) and is imported only when asked for.
"""
from __future__ import annotations

import importlib
import sys


def _lazy(module: str):
    def run(argv: list[str]) -> int:
        return importlib.import_module(module).main(argv)
    return run


DESCRIPTIONS = {
    "kernels": "each Triton kernel vs its torch reference (and SDPA on GPU)",
    "attention": "paged attention vs hardware ceilings and SDPA (GPU)",
    "engine": "end-to-end generation speed per backend",
}
COMMANDS = {
    "kernels": _lazy("minikv.bench.kernels"),        # each Triton kernel vs its torch reference (and SDPA on GPU)
    "attention": _lazy("minikv.bench.attention"),    # paged attention vs hardware ceilings and SDPA (GPU)
    "engine": _lazy("minikv.bench.engine"),          # end-to-end generation speed per backend
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m minikv.bench {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:]) or 0
