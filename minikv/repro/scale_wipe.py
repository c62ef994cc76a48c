"""`minikv repro scale-wipe`: defect A, buggy and fixed, over max_num_seqs x prefix caching x cache format.

For every configuration a fixed engine and a buggy engine (`reintroduce=("scale-wipe",)`) serve the same
requests. A request is *damaged* when the buggy engine's answer is wrong by the task's check and differs from
the fixed engine's. After the first forward step, the K/V of the first batch's prompt are read back from the
KV-sharing targets' pools of both engines: the ratio of their magnitudes is the measured inflation, compared
with 1 / (the true scale the fixed engine stored).

Upstream signatures checked (exit status 0 only if all hold): the buggy engine damages exactly the first
max_num_seqs requests with prefix caching off (at least those with it on), later batches stay clean, the fills
that wipe written scales are late fills of KV-sharing layers, the inflation equals 1 / true scale, a 16-bit cache
is untouched by the switch, and every fixed run has zero damaged requests.
"""
from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from minikv.repro.common import dequantized_rows, ranges, stored_scales

FORMATS = ("int8_per_token_head", "fp8_per_token_head")


@dataclass
class Run:
    kv_cache_dtype: str
    max_num_seqs: int
    prefix_caching: bool
    buggy: bool
    texts: list[str]
    right: list[bool]
    harmless_fills: int
    late_fills: list[tuple[str, int]]
    first_batch_kv: dict = field(default_factory=dict)   # target layer -> (K, V, K scales, V scales) at step 0
    damaged: list[int] = field(default_factory=list)
    k_inflation: float = float("nan")
    v_inflation: float = float("nan")
    inflation_error: float = float("nan")                 # max relative deviation from 1 / true scale


def make_prompts(num_requests: int, copies: int = 2, seed: int = 0) -> list[str]:
    """Upstream's shape in small: distinct prompts, then the same list again (copies of each)."""
    import minikv
    task = minikv.tasks.for_model("tiny-kvshare")
    distinct = task.prompts(max(1, num_requests // copies), seed=seed)
    return list(itertools.islice(itertools.cycle(distinct), num_requests))


def run_engine(kv_cache_dtype: str, max_num_seqs: int, prefix_caching: bool, buggy: bool, prompts: list[str],
               device: str = "cpu", backend: str = "triton", max_tokens: int = 12) -> Run:
    import minikv
    task = minikv.tasks.for_model("tiny-kvshare")
    llm = minikv.LLM(model="tiny-kvshare", kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                     enable_prefix_caching=prefix_caching, device=device, backend=backend,
                     reintroduce=("scale-wipe",) if buggy else ())
    layout = llm.runner.layout
    captured: dict = {}
    ids = [llm.add_request(p, minikv.SamplingParams(max_tokens=max_tokens)) for p in prompts]
    results = {}
    while llm.has_unfinished():
        out = llm.step()
        if out.step == 0 and layout.has_inline_scales:
            # Right after the very first forward step: read the first batch's rows back from the pools the
            # KV-sharing layers read (their targets' pools).
            sharing = {e.pool for e in out.trace.events if e.read and not e.wrote and e.kind == "self"}
            slots = [s for rid in out.request_ids for s in out.block_slots(rid, layout.block_size)]
            for name in sorted(sharing):
                pool = llm.arena.pool(name)
                k, v = dequantized_rows(layout, pool, slots)
                ks, vs = stored_scales(layout, pool, slots)
                captured[name] = (k, v, ks, vs)
        results.update({r.request_id: r for r in out.finished})
    outs = [results[i] for i in ids]
    texts = [o.text for o in outs]
    census = llm.census
    return Run(kv_cache_dtype, max_num_seqs, prefix_caching, buggy, texts,
               [task.check(p, t) for p, t in zip(prompts, texts)], len(census.harmless),
               [(f.layer, f.overwritten) for f in census.wiping], captured)


def compare(fixed: Run, buggy: Run) -> None:
    """Fill in the buggy run's damage and inflation, measured against the fixed run."""
    buggy.damaged = [i for i, (t, f, ok) in enumerate(zip(buggy.texts, fixed.texts, buggy.right))
                     if t != f and not ok]
    fixed.damaged = [i for i, ok in enumerate(fixed.right) if not ok]
    ratios_k, ratios_v, errors = [], [], []
    for name, (kb, vb, _, _) in buggy.first_batch_kv.items():
        kf, vf, ksf, vsf = fixed.first_batch_kv[name]
        rk = kb.norm(dim=-1) / kf.norm(dim=-1).clamp_min(1e-30)
        rv = vb.norm(dim=-1) / vf.norm(dim=-1).clamp_min(1e-30)
        live = kf.norm(dim=-1) > 0
        ratios_k.append(rk[live])
        ratios_v.append(rv[vf.norm(dim=-1) > 0])
        errors.append(((rk * ksf - 1).abs())[live])
    if ratios_k:
        buggy.k_inflation = float(torch.cat(ratios_k).median())
        buggy.v_inflation = float(torch.cat(ratios_v).median())
        buggy.inflation_error = float(torch.cat(errors).max())


def check_signatures(pairs: list[tuple[Run, Run]], clean16: tuple[Run, Run] | None) -> list[str]:
    """Return the list of signatures that did NOT hold (empty = reproduction faithful)."""
    problems = []
    for fixed, buggy in pairs:
        tag = f"{buggy.kv_cache_dtype} max_num_seqs={buggy.max_num_seqs} prefix_caching={buggy.prefix_caching}"
        first = list(range(buggy.max_num_seqs))
        if fixed.damaged:
            problems.append(f"fixed {tag}: damaged {ranges(fixed.damaged)}")
        if not buggy.prefix_caching and buggy.damaged != first:
            problems.append(f"buggy {tag}: damaged {ranges(buggy.damaged)}, expected exactly {ranges(first)}")
        if buggy.prefix_caching and not set(first) <= set(buggy.damaged):
            problems.append(f"buggy {tag}: first batch not all damaged ({ranges(buggy.damaged)})")
        if not buggy.late_fills:
            problems.append(f"buggy {tag}: no late fill wiped written scales")
        if fixed.late_fills:
            problems.append(f"fixed {tag}: a fill wiped written scales")
        if not buggy.inflation_error < 1e-4:
            problems.append(f"buggy {tag}: inflation differs from 1/true scale by {buggy.inflation_error:.3g}")
    if clean16 is not None:
        fixed, buggy = clean16
        if buggy.texts != fixed.texts:
            problems.append("a 16-bit cache changed its outputs under the scale-wipe switch")
    return problems


def format_table(pairs: list[tuple[Run, Run]], clean16) -> str:
    head = (f"{'kv_cache_dtype':22s} {'seqs':>4s} {'prefix':>6s} {'version':7s} {'damaged requests':18s} "
            f"{'K infl':>8s} {'V infl':>8s}  fills (harmless | late: wiped scales)")
    lines = [head, "-" * len(head)]
    for fixed, buggy in pairs:
        for r in (buggy, fixed):
            late = ", ".join(f"{layer}: {n:,}" for layer, n in r.late_fills) or "-"
            infl_k = f"x{r.k_inflation:.0f}" if r.buggy and r.k_inflation == r.k_inflation else "-"
            infl_v = f"x{r.v_inflation:.0f}" if r.buggy and r.v_inflation == r.v_inflation else "-"
            lines.append(f"{r.kv_cache_dtype:22s} {r.max_num_seqs:4d} {('on' if r.prefix_caching else 'off'):>6s} "
                         f"{('buggy' if r.buggy else 'fixed'):7s} {ranges(r.damaged):18s} {infl_k:>8s} {infl_v:>8s}  "
                         f"{r.harmless_fills} | {late}")
    if clean16 is not None:
        fixed, buggy = clean16
        same = "identical outputs" if fixed.texts == buggy.texts else "OUTPUTS DIFFER"
        lines.append(f"{'auto (16/32-bit)':22s} {buggy.max_num_seqs:4d} {'off':>6s} {'buggy':7s} "
                     f"{ranges([i for i, ok in enumerate(buggy.right) if not ok]):18s} {'-':>8s} {'-':>8s}  "
                     f"no inline scales: {same} to the fixed engine")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minikv repro scale-wipe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default=None, choices=("triton", "torch"),
                   help="kernel backend (default: triton on cuda; torch on cpu, where the Triton interpreter would "
                        "take many minutes: the defect lives in the engine's Python, which both backends run)")
    p.add_argument("--requests", type=int, default=24, help="requests per run (default 24: two copies of 12 "
                                                             "prompts); upstream used 192 (48 prompts x 4)")
    p.add_argument("--max-num-seqs", type=int, nargs="+", default=[4, 6, 8])
    p.add_argument("--formats", nargs="+", default=list(FORMATS), choices=FORMATS)
    args = p.parse_args(argv)
    args.backend = args.backend or ("triton" if args.device.startswith("cuda") else "torch")

    start = time.perf_counter()
    prompts = make_prompts(args.requests, copies=2)
    configs = list(itertools.product(args.formats, args.max_num_seqs, (False, True)))
    pairs = []
    for fmt, seqs, pc in tqdm(configs, desc="scale-wipe configurations"):
        if seqs * 2 > len(prompts):
            raise SystemExit(f"--requests {len(prompts)} is too few for max_num_seqs {seqs}: need at least "
                             f"{2 * seqs} so that a later batch exists")
        fixed = run_engine(fmt, seqs, pc, False, prompts, args.device, args.backend)
        buggy = run_engine(fmt, seqs, pc, True, prompts, args.device, args.backend)
        compare(fixed, buggy)
        pairs.append((fixed, buggy))
    seqs = min(args.max_num_seqs)
    clean16 = (run_engine("auto", seqs, False, False, prompts, args.device, args.backend),
               run_engine("auto", seqs, False, True, prompts, args.device, args.backend))
    print(format_table(pairs, clean16))
    problems = check_signatures(pairs, clean16)
    print(f"\n{len(configs)} configurations x (buggy, fixed), {len(prompts)} requests each, "
          f"on {args.device}/{args.backend}, {time.perf_counter() - start:.0f} s")
    if problems:
        print("Signatures NOT reproduced:")
        for line in problems:
            print(f"  - {line}")
        return 1
    print("All upstream signatures reproduced; every fixed run has zero damaged requests.")
    return 0
