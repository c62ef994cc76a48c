"""`minikv hunt`: the hunter's command line. Exit status 0: nothing found; 1: an invariant failed; 2: usage error.

The options are defined here; minikv/cli/ adds the subcommand and `--reintroduce` (checked there against the
defect registry, so this package never reads it).
"""
from __future__ import annotations

import argparse


# The adapters minikv.attention.backends holds (their names, spelled here so the parser imports no torch).
FOREIGN_BACKENDS = ("flexattention", "sdpa", "flashinfer")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    from minikv.engine.arguments import whole_number

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
    p.add_argument("--backend", default="torch", choices=("torch", "triton") + FOREIGN_BACKENDS,
                   help="torch or triton: the engine's kernels (default torch: the references, fast on CPU), hunted "
                        "through whole-engine scenarios; flexattention, sdpa or flashinfer: that attention backend "
                        "alone, over the kernel-level families (docs/backends.md)")
    p.add_argument("--family", action="append", default=None, metavar="NAME",
                   help="with a foreign --backend: hunt only this family (repeatable; default all: "
                        "block-tables, gqa, head-sizes, block-sizes, sliding-window, kv-sharing, cross-pools, "
                        "fp8-scales)")
    p.add_argument("--results", default=None, metavar="PATH",
                   help="write the report as JSON: the settings, every scenario tried with its cell and outcome, the "
                        "finding (its invariants, the shrunk scenario, the reproduction) and the timings")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="save the search map (which cell each scenario ran in, in order, and where an invariant "
                        "first failed) as a picture, e.g. map.png or map.svg")


def check_outputs(args) -> None:
    """Refuse a --results or --plot path that cannot be written before the hunt starts, not after it."""
    from pathlib import Path
    for option, path in (("--results", getattr(args, "results", None)), ("--plot", getattr(args, "plot", None))):
        if path is None:
            continue
        parent = Path(path).resolve().parent
        if not parent.is_dir():
            raise ValueError(f"{option} {path}: the directory {parent} does not exist")
    if getattr(args, "plot", None):
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib.figure import Figure
        kinds = Figure().canvas.get_supported_filetypes()
        suffix = Path(args.plot).suffix.lstrip(".").lower()
        if suffix not in kinds:
            raise ValueError(f"--plot {args.plot}: name a picture file, ending in one of "
                             f"{', '.join('.' + k for k in sorted(kinds))}")


def write_json(path, data: dict) -> None:
    import json
    from pathlib import Path
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def save_plot(path, reports: dict) -> None:
    from .figure import search_map
    search_map(reports).savefig(path, dpi=100)


def results_data(report, command: str, label: str) -> dict:
    """What `--results` writes for one hunt: the command, the machine, and the report (HuntReport.to_dict)."""
    import os

    import minikv
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"name": "hunt", "command": command, "minikv": minikv.__version__, "label": label,
            "machine": {"cpus": os.cpu_count(), "load_average": None if load is None else round(load, 1)},
            **report.to_dict()}


def run(args, label: str = "the hunt", command: str = "minikv hunt") -> int:
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        print("minikv hunt: error: the hunter is built on hypothesis, which is not installed: "
              "pip install hypothesis (a dependency of minikv; missing only after a --no-deps install)")
        return 2
    check_outputs(args)
    if args.backend in FOREIGN_BACKENDS:
        return run_backend(args, command)
    if getattr(args, "family", None):
        raise ValueError("--family goes with a foreign --backend (flexattention, sdpa, flashinfer)")
    from minikv.engine.progress import held_warnings
    from minikv.models import registry

    from .search import hunt
    if getattr(args, "model", None):
        registry.check_loadable(args.model)            # a bad model is one error line, before the bar
    with held_warnings():                               # library warnings: each once, after the bar
        report = hunt(model=getattr(args, "model", None),
                      reintroduce=tuple(getattr(args, "reintroduce", ()) or ()), backend=args.backend, seed=args.seed,
                      budget_s=args.budget, max_scenarios=args.max_scenarios or None, oracles=args.oracle)
    print(report.text())
    print("(scenario, cell, wave, refused, near tie, shrunk: `minikv hunt --help` says what each word means)")
    if getattr(args, "results", None):
        write_json(args.results, results_data(report, command, label))
        print(f"results written to {args.results}")
    if getattr(args, "plot", None):
        save_plot(args.plot, {label: report})
        print(f"search map written to {args.plot}")
    return 1 if report.found else 0


def run_backend(args, command: str) -> int:
    """`minikv hunt --backend flexattention|sdpa|flashinfer`: the kernel-level families against that adapter."""
    for option in ("model", "oracle", "plot"):
        if getattr(args, option, None):
            raise ValueError(f"--{option} goes with the engine hunt (--backend torch or triton), not with "
                             f"--backend {args.backend}")
    if getattr(args, "reintroduce", None):
        raise ValueError(f"--reintroduce switches minikv's own defects on; --backend {args.backend} hunts that "
                         f"adapter alone")
    from minikv.attention.backends import MissingBackendError

    from .backend_hunt import hunt_backend
    try:
        report = hunt_backend(args.backend, families=args.family, seed=args.seed, budget_s=args.budget,
                              max_scenarios=args.max_scenarios or None)
    except MissingBackendError as e:
        print(f"minikv hunt: error: {e}")
        return 2
    print(report.text())
    if getattr(args, "results", None):
        import os
        write_json(args.results, {"name": "hunt-backend", "command": command,
                                  "machine": {"cpus": os.cpu_count()}, **report.to_dict()})
        print(f"results written to {args.results}")
    return 1 if report.found else 0
