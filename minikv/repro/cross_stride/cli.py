"""`minikv repro cross-stride`'s command line: measures, prints the tables, checks the signatures (exit status 0
only if all hold), and writes `--results`.
"""
from __future__ import annotations

import argparse
import sys
import time

from .arena import check_arena_runs, format_arena_runs
from .report import check_signatures, format_tables, measure, write_results
from .run import AUTO_REFERENCE, MODEL, RESULTS_COMMAND


def main(argv: list[str] | None = None) -> int:
    from minikv.engine.arguments import UsageParser, device_and_backend_args, positive_int, resolve_backend
    p = UsageParser(prog="minikv repro cross-stride", description=sys.modules[__package__].__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL,
                   help=f"{MODEL} (the default) or the path of a T5 checkpoint directory (config.json, "
                        "safetensors, tokenizer)")
    device_and_backend_args(p)
    p.add_argument("--requests", type=positive_int, default=6, help="requests served at once (default 6)")
    p.add_argument("--results", default=None, metavar="PATH",
                   help="also write the measured quantities and tables as JSON (e.g. results/cross_stride.json)")
    args = p.parse_args(argv)
    resolve_backend(args)

    from minikv.models import registry
    model = registry.check_loadable(args.model)       # a bad model is one error line, before any bar
    start = time.perf_counter()
    m = measure(args.requests, args.device, args.backend, progress=True, model=model)
    print(f"model: {m.model}; token ids are compared with {m.reference}")
    print(format_tables(m.need, m.pool_runs, m.bind_error, m.ctx_runs))
    problems = check_signatures(m.pool_runs, m.bind_error, m.ctx_runs, m.reference == AUTO_REFERENCE)
    if m.model == MODEL and m.reference != AUTO_REFERENCE:
        problems.append(f"{MODEL}: the fixed fp8 engine's token ids differ from the auto-cache run")
    print("\nthree identical requests, B1 reintroduced, sanitizer off: copies whose token ids differ from auto")
    print("  " + "; ".join(f"{b} blocks ({f:.2f}x): {', '.join(map(str, d)) or 'none'}" for b, f, d in m.copies))
    # upstream's "first request differs" symptom was seen on a trained model; on one whose tokens move with fp8
    # rounding alone (random weights) the table is shown, not checked
    strict = m.reference == AUTO_REFERENCE
    if strict and (not any(0 in d for _, f, d in m.copies if f < 2) or any(d for _, f, d in m.copies if f >= 2)):
        problems.append("identical requests: the first copy never differed below 2x, or a copy differed at 2x")
    if m.arenas:
        print("\nB1 at 1.5x by how the pools are allocated (historical stride):")
        print(format_arena_runs(m.arenas, len(m.prompts)))
        problems += check_arena_runs(m.arenas)
    print(f"\n{len(m.prompts)} requests, {len(m.pool_runs)} pool runs + {len(m.ctx_runs)} context runs on "
          f"{args.device}/{args.backend}, {time.perf_counter() - start:.0f} s")
    if args.results:
        command = "minikv repro cross-stride " + " ".join(argv if argv is not None else [])
        write_results(m, args.results, command.strip() if argv is not None else RESULTS_COMMAND)
        print(f"results written to {args.results}")
    if problems:
        print("Signatures NOT reproduced:")
        for line in problems:
            print(f"  - {line}")
        return 1
    print("All signatures reproduced; every fixed run equals "
          + ("the auto-cache run." if m.reference == AUTO_REFERENCE else "the fixed fp8 engine's answers."))
    return 0
