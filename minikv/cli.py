"""The `minikv` command: demo, generate, eval, train, repro, bench, bugs, hunt.

Every error ends as one line on stderr, `minikv: error: MESSAGE (hint: WHAT TO DO)`, and an exit status: 2 for bad
input (an argument, a checkpoint directory or a prompt minikv cannot take: argparse's own checks, minikv's
`BadInputError`s and its boundary checks' ValueError/TypeError/MemoryError), 1 for a found defect or failed check
(a hunt's finding, a reproduction whose signatures do not hold, the sanitizer's `KVCacheOverrunError`), 3 for an
engine fault (anything else: a fault in minikv). `--traceback` anywhere on the command line, or MINIKV_TRACEBACK=1,
prints the traceback too. The reproductions, benchmarks and the hunter parse their own options with `UsageParser`,
so their usage errors look the same.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

from minikv.argtypes import UsageParser, model_arg, positive_int
from minikv.config import BACKENDS, KV_CACHE_DTYPES


def _cmd_demo(args) -> int:
    from minikv import demo
    return demo.main(device=args.device)


def _cmd_generate(args) -> int:
    import minikv
    llm = minikv.LLM(model=args.model, kv_cache_dtype=args.kv_cache_dtype, device=args.device,
                     backend=args.backend, max_num_seqs=args.max_num_seqs)
    params = minikv.SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    for out in llm.generate(args.prompts, params):
        print(f"{out.prompt!r} -> {out.text!r}  [{out.finish_reason}]")
    return 0


def _cmd_eval(args) -> int:
    from minikv import evaluate
    result = evaluate.exact_match(args.model, args.kv_cache_dtype, n=args.n, device=args.device,
                                  backend=args.backend, max_num_seqs=args.max_num_seqs, task=args.task)
    print(result.report())
    return 0


def _cmd_train(args) -> int:
    from minikv.models import train
    metrics = train.train(args.model, steps=args.steps, seed=args.seed, out_dir=args.out_dir)
    print(metrics)
    print(f"checkpoint written to {args.out_dir}/{args.model}/; to ship it, copy it over "
          f"minikv/models/weights/{args.model}/")
    return 0


def _cmd_repro(args) -> int:
    import importlib
    module = importlib.import_module({"scale-wipe": "minikv.repro.scale_wipe",
                                      "cross-stride": "minikv.repro.cross_stride"}[args.defect])
    return module.main(args.rest)


def _cmd_bench(args) -> int:
    from minikv.bench import main as bench_main
    return bench_main([args.what] + args.rest)


def _cmd_hunt(args) -> int:
    from minikv.hunt import cli as hunt_cli
    return hunt_cli.run(args)


def _cmd_bugs(args) -> int:
    from minikv import bugs
    print(bugs.table())
    return 0


def build_parser() -> argparse.ArgumentParser:
    import minikv
    from minikv.models.registry import MODEL_NAMES
    p = UsageParser(prog="minikv", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"minikv {minikv.__version__}")
    p.add_argument("--traceback", action="store_true",
                   help="on an error, print the traceback before the one-line message (anywhere on the command "
                        "line; or set MINIKV_TRACEBACK=1)")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the main job: kernels vs references per format, then both models generate")
    d.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when there is one)")
    d.set_defaults(func=_cmd_demo)

    def engine_args(sp):
        model_arg(sp)
        sp.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
        sp.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
        sp.add_argument("--backend", default="triton", choices=BACKENDS)
        sp.add_argument("--max-num-seqs", type=positive_int, default=8)

    g = sub.add_parser("generate", help="generate continuations for prompts")
    engine_args(g)
    g.add_argument("prompts", nargs="+")
    g.add_argument("--max-tokens", type=positive_int, default=12)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None)
    g.set_defaults(func=_cmd_generate)

    e = sub.add_parser("eval", help="greedy exact match on held-out prompts of the model's task")
    engine_args(e)
    e.add_argument("--n", type=positive_int, default=200, help="number of held-out prompts (at least 1)")
    e.add_argument("--task", default=None, choices=MODEL_NAMES,
                   help="whose task's prompts (default: the model's; for a checkpoint directory, its directory "
                        "name when that is a shipped model's, as `minikv train` writes them)")
    e.set_defaults(func=_cmd_eval)

    t = sub.add_parser("train", help="train a shipped model from scratch (writes a checkpoint directory)")
    t.add_argument("model", choices=MODEL_NAMES)
    t.add_argument("--steps", type=positive_int, default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--out-dir", default="build/weights", help="where to write the weights (default build/weights; "
                                                             "the shipped weights are never overwritten)")
    t.set_defaults(func=_cmd_train)

    r = sub.add_parser("repro", help="reproduce a historical defect, buggy and fixed, and check its signatures")
    r.add_argument("defect", choices=("scale-wipe", "cross-stride"))
    r.add_argument("rest", nargs=argparse.REMAINDER)
    r.set_defaults(func=_cmd_repro)

    from minikv.bench import DESCRIPTIONS
    b = sub.add_parser("bench", help="benchmarks (kernels, engine, attention)",
                       description="benchmarks: " + "; ".join(f"{k}: {v}" for k, v in DESCRIPTIONS.items()))
    b.add_argument("what", choices=tuple(DESCRIPTIONS), help="which benchmark: " + ", ".join(DESCRIPTIONS))
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=_cmd_bench)

    s = sub.add_parser("bugs", help="list the historical defects minikv can reintroduce")
    s.set_defaults(func=_cmd_bugs)

    # `minikv hunt` (issue 23): its options live in minikv/hunt/cli.py; --reintroduce is checked here against the
    # registry, so the hunter itself never reads defect names.
    from minikv.bugs import DEFECTS
    from minikv.hunt.cli import add_arguments as hunt_arguments
    h = sub.add_parser("hunt", help="search engine configurations for violated KV-cache invariants "
                                    "(exit 0: clean, 1: found, 2: usage error)")
    hunt_arguments(h)
    h.add_argument("--reintroduce", nargs="+", default=[], choices=tuple(DEFECTS), metavar="NAME",
                   help="run the hunt on an engine with these historical defects switched back on: "
                        + ", ".join(DEFECTS))
    h.set_defaults(func=_cmd_hunt)
    return p


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def describe_error(err: BaseException) -> tuple[int, str]:
    """(exit status, the one line after `minikv: error: `) for an exception a command raised.

    minikv's own errors (`minikv.MinikvError`) carry their status and hint. ValueError, TypeError and MemoryError
    come from minikv's boundary checks of an argument (bad input, 2); OSError from a file the command was told to
    read or write (2). Anything else is a fault of minikv itself (3)."""
    from minikv.kernels.errors import BAD_INPUT, ENGINE_FAULT, MinikvError
    if isinstance(err, MinikvError):
        status, hint = err.exit_status, err.hint
    elif isinstance(err, (ValueError, TypeError, MemoryError, OSError)):
        status, hint = BAD_INPUT, None
    else:
        return ENGINE_FAULT, (f"internal error, {type(err).__name__}: {_one_line(err)} (a fault in minikv: run again "
                              f"with --traceback and report it)")
    return status, _one_line(err) + (f" (hint: {' '.join(hint.split())})" if hint else "")


def _wants_traceback(argv: list[str]) -> tuple[bool, list[str]]:
    """--traceback anywhere on the command line (taken out before parsing: the subcommands that parse their own
    options never see it), or MINIKV_TRACEBACK=1 in the environment."""
    wanted = os.environ.get("MINIKV_TRACEBACK", "").strip() not in ("", "0")
    if "--traceback" in argv:
        end = argv.index("--") if "--" in argv else len(argv)
        if "--traceback" in argv[:end]:
            wanted = True
            argv = [a for i, a in enumerate(argv) if not (a == "--traceback" and i < end)]
    return wanted, argv


def main(argv: list[str] | None = None) -> int:
    """Run the command; return its exit status (0, or 1 for a found defect or failed check). An error exits through
    SystemExit with its status after one line on stderr: `minikv: error: MESSAGE (hint: WHAT TO DO)`."""
    show_traceback, argv = _wants_traceback(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")
    except Exception as err:  # noqa: BLE001  (every error ends as one line and a documented status)
        status, message = describe_error(err)
        if show_traceback:
            traceback.print_exc()
        sys.stdout.flush()
        parser.exit(status, f"{parser.prog}: error: {message}\n")


if __name__ == "__main__":
    sys.exit(main())
