"""`minikv hunt`: the hunter's command line. Exit status 0: nothing found; 1: an invariant failed; 2: usage error.

The options are defined here; minikv/cli.py adds the subcommand and `--reintroduce` (checked there against the
defect registry, so this package never reads it).
"""
from __future__ import annotations

import argparse


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    from minikv.argtypes import whole_number
    from .oracles import ORACLES
    _count = whole_number(0)
    p.add_argument("--model", default=None, metavar="NAME|PATH",
                   help="hunt over this model only: a shipped model or a checkpoint directory in transformers' format "
                        "(its prompts come from its own tokenizer, its cells from its config, its dense reference "
                        "from the same weights); default: the trained models tiny-gemma4 and tiny-t5")
    p.add_argument("--budget", type=_positive_float, default=60.0, metavar="SECONDS",
                   help="stop searching after this many seconds (default 60; shrinking a failure comes on top)")
    p.add_argument("--seed", type=_count, default=0, metavar="N",
                   help="hypothesis seed: the same seed tries the same scenarios in the same order (default 0)")
    p.add_argument("--max-scenarios", type=_count, default=None, metavar="N",
                   help="also stop after N scenarios (a limit that does not depend on the machine's speed)")
    p.add_argument("--oracle", action="append", choices=tuple(ORACLES), metavar="NAME",
                   help="check only this invariant (repeatable; default all: " + ", ".join(ORACLES) + ")")
    p.add_argument("--backend", default="torch", choices=("torch", "triton"),
                   help="the engine's kernels (default torch: the references, fast on CPU)")


def run(args) -> int:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        print("minikv hunt: error: the hunter is built on hypothesis, which is not installed: "
              "pip install hypothesis (a dependency of minikv; missing only after a --no-deps install)")
        return 2
    from .search import hunt
    report = hunt(model=args.model, reintroduce=tuple(getattr(args, "reintroduce", ()) or ()), backend=args.backend,
                  seed=args.seed,
                  budget_s=args.budget, max_scenarios=args.max_scenarios or None, oracles=args.oracle)
    print(report.text())
    return 1 if report.found else 0
