"""Benchmarks, run as `python -m minikv.bench <name> [options]`.

COMMANDS maps each benchmark name to a function taking the remaining command-line arguments; each benchmark
lives in its own module and is imported only when asked for.
"""
from __future__ import annotations

import sys


def _kernels(argv: list[str]) -> int:
    from .kernels import main
    return main(argv)


COMMANDS = {
    "kernels": _kernels,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m minikv.bench {{{','.join(COMMANDS)}}} [options]", file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:]) or 0
