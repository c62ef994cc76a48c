"""`minikv repro scale-wipe`'s command line: runs the grid of configurations, prints the tables and the
quantities, checks upstream's signatures (exit status 0 only if all hold), and writes `--results`.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

from tqdm import tqdm

from minikv.engine.progress import held_warnings
from minikv.models import registry
from minikv.repro.common import ranges

from .census import UPSTREAM_CENSUS, check_signatures, format_census, format_table
from .experiments import (
    PREFIX_COLUMNS,
    WARMUP_COLUMNS,
    arrival_run,
    check_extra_signatures,
    check_prefix_runs,
    check_warmup_census,
    format_arrivals,
    format_prefix_runs,
    format_wake_table,
    format_warmup_census,
    prefix_caching_runs,
    prefix_rows,
    wake_runs,
    warmup_census,
    warmup_census_rows,
)
from .report import HEADLINE, format_quantities, headline_pair, results
from .run import E2B_MODEL, FORMATS, MODEL, attention_damage, compare, judge_of, make_prompts, run_engine


def main(argv: list[str] | None = None) -> int:
    from minikv.engine.arguments import UsageParser, device_and_backend_args, positive_int, resolve_backend
    p = UsageParser(prog="minikv repro scale-wipe", description=sys.modules[__package__].__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL,
                   help=f"a shipped model ({MODEL}: trained; {E2B_MODEL}: gemma-4-E2B's topology, random weights) "
                        "or the path of a Gemma-4 checkpoint directory (config.json, safetensors, tokenizer)")
    device_and_backend_args(p)
    p.add_argument("--requests", type=positive_int, default=24, help="requests per run (default 24: two copies of "
                                                                      "12 prompts); upstream used 192 (48 x 4)")
    p.add_argument("--max-num-seqs", type=positive_int, nargs="+", default=[4, 6, 8])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    p.add_argument("--max-tokens", type=int, default=12, help="new tokens per request (default 12)")
    p.add_argument("--damage", default="tokens", choices=("tokens", "attention"),
                   help="how a damaged request is recognized: by its answer (tokens, the default), or by its prefill "
                        "step's attention outputs in the KV-sharing layers differing from the fixed engine's "
                        "(attention: for random weights, whose tokens may take many steps to diverge)")
    p.add_argument("--skip-extras", action="store_true",
                   help="only the main grid and the census (not the warmup, prefix-caching, sleep, unwritten-slot "
                        "and arrival tables)")
    p.add_argument("--results", default=None, metavar="PATH",
                   help="write the measured quantities and tables as JSON (results/scale_wipe.json; the file's stem "
                        "is its name)")
    args = p.parse_args(argv)
    resolve_backend(args)
    if args.requests < 2 * max(args.max_num_seqs):
        p.error(f"--requests {args.requests} is too few for --max-num-seqs {max(args.max_num_seqs)}: need at least "
                f"{2 * max(args.max_num_seqs)}, so that a batch after the first exists")
    model = registry.check_loadable(args.model)       # a bad model is one error line, before any bar

    start = time.perf_counter()
    prompts = make_prompts(args.requests, copies=2, model=model)
    configs = list(itertools.product(args.formats, args.max_num_seqs, (False, True)))
    kw = {"max_tokens": args.max_tokens, "model": model}
    by_attention = args.damage == "attention"
    pairs = []
    with held_warnings():                               # library warnings: each once, after the bar
        for fmt, seqs, pc in tqdm(configs, desc="scale-wipe configurations"):
            fixed = run_engine(fmt, seqs, pc, False, prompts, args.device, args.backend,
                               capture_attention=by_attention, **kw)
            buggy = run_engine(fmt, seqs, pc, True, prompts, args.device, args.backend,
                               capture_attention=by_attention, **kw)
            compare(fixed, buggy)
            if by_attention:
                by_tokens, buggy.damaged = buggy.damaged, attention_damage(fixed, buggy)
                tqdm.write(f"{fmt} max_num_seqs={seqs} prefix caching {'on' if pc else 'off'}: attention outputs "
                           f"differ for requests {ranges(buggy.damaged)}; token ids differ for {ranges(by_tokens)}")
            pairs.append((fixed, buggy))
    seqs = min(args.max_num_seqs)
    clean16 = (run_engine("auto", seqs, False, False, prompts, args.device, args.backend, **kw),
               run_engine("auto", seqs, False, True, prompts, args.device, args.backend, **kw))
    print(f"model: {model}; a damaged request: "
          + ("prefill-step attention outputs in the KV-sharing layers other than the fixed engine's" if by_attention
             else "wrong by the task's check and different from the fixed engine's answer"
             if pairs[0][1].judge == "task"
             else "token ids other than the fixed engine's (its answers cannot be judged right or wrong)"))
    print(format_table(pairs, clean16))
    problems = check_signatures(pairs, clean16)
    headline = None
    if HEADLINE[0] in args.formats and HEADLINE[1] in args.max_num_seqs:
        _, headline = headline_pair(pairs)
        print(f"\nscale-fill census ({headline.kv_cache_dtype}, max_num_seqs={headline.max_num_seqs}, buggy engine; "
              f"which layer made each fill is minikv's reading, upstream gives only the totals):")
        print(format_census(headline))
        print("\nquantities (one number each; the statistic named):")
        print(format_quantities(pairs))
    elif args.results:
        raise SystemExit(f"--results needs the headline configuration {HEADLINE[:2]} among the runs")

    extra_tables = {}
    if not args.skip_extras:
        from minikv.repro import unwritten_slots
        few = prompts[: 2 * seqs]
        census_rows_ = warmup_census(few, seqs, args.device, args.backend, **kw)
        print(f"\nwarmup shape and the census (int8_per_token_head, max_num_seqs={seqs}, buggy engine); upstream "
              f"tags its {UPSTREAM_CENSUS['harmless']} harmless fills '(pre-write)':")
        print(format_warmup_census(census_rows_, model))
        problems += check_warmup_census(census_rows_, seqs)
        warmups = {r.case: r.damaged for r in census_rows_}
        extra_tables["warmup_census"] = {
            "caption": f"The buggy engine's scale fills per warmup shape ({model}, int8_per_token_head, "
                       f"max_num_seqs={seqs}): before the first write into their storage, after it with nothing "
                       "left to wipe, or wiping (minikv's reading of upstream's '(pre-write)')",
            "columns": WARMUP_COLUMNS, "rows": warmup_census_rows(census_rows_)}
        prefix = prefix_caching_runs(device=args.device, backend=args.backend, model=model)
        print("\nprefix caching on, buggy engine: 6 prompts x 4 copies (upstream: 48 x 4), by the order of the copies "
              "and the prompts' length (blocks of 16 tokens):")
        print(format_prefix_runs(prefix))
        problems += check_prefix_runs(prefix)
        how = ("prefill-step attention outputs of the sharing layers other than the fixed engine's"
               if judge_of(model) == "fixed run" else "wrong answers")
        extra_tables["prefix_caching_orders"] = {
            "caption": f"Damaged requests ({how}) with prefix caching on ({model}, int8_per_token_head, 6 prompts "
                       "x 4 copies, 4 new tokens): copies after the distinct prompts or next to each other; prompts "
                       "without a full 16-token block or with two",
            "columns": PREFIX_COLUMNS, "rows": prefix_rows(prefix)}
        wakes = wake_runs(few, seqs, args.device, args.backend, **kw)
        print("\nsleep / wake_up (int8_per_token_head; first batch after the wake-up):")
        print(format_wake_table(wakes))
        unwritten = unwritten_slots.run(("torch", "triton"), device=args.device)
        print("\nwho reads a scale slot nobody wrote (output compared with the 1.0-fill output):")
        print(unwritten_slots.format_table(unwritten))
        arrivals = [arrival_run(few, seqs, seed, args.device, args.backend, **kw) for seed in range(4)]
        print(f"\narrival timing (buggy engine, max_num_seqs={seqs}, requests arrive 0-{seqs} per step, seeded):")
        print(format_arrivals(arrivals))
        problems += check_extra_signatures(warmups, seqs, wakes, unwritten, arrivals)
    if args.results:
        from pathlib import Path
        command = "minikv repro scale-wipe " + " ".join(sys.argv[1:] if argv is None else argv)
        with open(args.results, "w") as fh:
            json.dump(results(pairs, clean16, command.strip(), name=Path(args.results).stem,
                              extra_tables=extra_tables), fh, indent=2)
            fh.write("\n")
        print(f"results written to {args.results}")
    print(f"\n{len(configs)} configurations x (buggy, fixed), {len(prompts)} requests each, "
          f"on {args.device}/{args.backend}, {time.perf_counter() - start:.0f} s")
    if problems:
        print("Signatures NOT reproduced:")
        for line in problems:
            print(f"  - {line}")
        return 1
    print("All upstream signatures reproduced; every fixed run has zero damaged requests.")
    return 0
