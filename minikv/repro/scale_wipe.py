"""`minikv repro scale-wipe`: defect A, buggy and fixed, over max_num_seqs x prefix caching x cache format.

For every configuration a fixed engine and a buggy engine (`reintroduce=("scale-wipe",)`) serve the same
requests. A request is *damaged* when the buggy engine's answer is wrong by the task's check and differs from
the fixed engine's. After the first forward step, the K/V of the first batch's prompt are read back from the
KV-sharing targets' pools of both engines: the ratio of their magnitudes is the measured inflation, compared
with 1 / (the true scale the fixed engine stored).

Upstream signatures checked (exit status 0 only if all hold): the buggy engine damages exactly the first
max_num_seqs requests with prefix caching off (at least those with it on; carrying the damage to later requests
through the prefix cache is minikv's own observation, upstream called the prefix-caching correlation spurious),
later batches stay clean, the fills that wipe written scales are late fills of KV-sharing layers, the inflation
equals 1 / true scale, a 16-bit cache is untouched by the switch, and every fixed run has zero damaged requests.

Then three smaller tables:
* warmup shape: the same buggy engine with a capture-shaped warmup (every layer run with attention metadata)
  damages nothing;
* sleep / wake_up: in both sleep modes the fixed engine initializes every scale region again; with nothing
  re-initializing after a same-address wake (a registry keyed by (data_ptr, nbytes) alone) the scale slots stay
  0 - which no minikv kernel reads; the historical engine's wipe is not re-armed by a wake-up;
* who reads unwritten scale slots (`minikv.repro.unwritten_slots`);
* arrival timing: requests arrive over several steps (seeded) through the step API; the damaged set is exactly the
  first scheduled batch, whatever it holds - why upstream saw the bug as stochastic under multiprocess serving.
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


def warmup_shape_runs(prompts, max_num_seqs: int, device="cpu", backend="torch") -> dict[str, list[int]]:
    """{warmup shape: damaged requests of the buggy engine} (damage judged against a fixed dummy-warmup engine)."""
    import minikv
    fixed = run_engine("int8_per_token_head", max_num_seqs, False, False, prompts, device, backend)
    out = {}
    for shape in ("dummy", "capture"):
        llm = minikv.LLM(model="tiny-kvshare", kv_cache_dtype="int8_per_token_head", max_num_seqs=max_num_seqs,
                         device=device, backend=backend, reintroduce=("scale-wipe",), warmup=shape)
        texts = [o.text for o in llm.generate(prompts, minikv.SamplingParams(max_tokens=12), use_tqdm=False)]
        task = minikv.tasks.for_model("tiny-kvshare")
        out[shape] = [i for i, (p, t, f) in enumerate(zip(prompts, texts, fixed.texts))
                      if t != f and not task.check(p, t)]
    return out


@dataclass
class ArrivalRun:
    seed: int
    arrivals: list[int]            # how many requests arrived before each step
    first_batch: list[int]         # the requests the first step ran (indices into the prompts)
    damaged: list[int]


def arrival_run(prompts, max_num_seqs: int, seed: int, device="cpu", backend="torch",
                max_tokens: int = 12) -> ArrivalRun:
    """The buggy engine driven step by step while requests arrive over several steps (0 to max_num_seqs of them
    before each step, seeded), as a server sees them: the damaged set is the first scheduled batch, whatever it
    holds."""
    import random

    import minikv
    rng = random.Random(seed)
    task = minikv.tasks.for_model("tiny-kvshare")
    llm = minikv.LLM(model="tiny-kvshare", kv_cache_dtype="int8_per_token_head", max_num_seqs=max_num_seqs,
                     device=device, backend=backend, reintroduce=("scale-wipe",))
    params = minikv.SamplingParams(max_tokens=max_tokens)
    pending, index_of, texts, arrivals, first = list(range(len(prompts))), {}, {}, [], None
    while pending or llm.has_unfinished():
        k = rng.randint(0, max_num_seqs)
        if not llm.has_unfinished():
            k = max(k, 1)
        for i in pending[:k]:
            index_of[llm.add_request(prompts[i], params)] = i
        arrivals.append(min(k, len(pending)))
        pending = pending[k:]
        out = llm.step()
        if first is None:
            first = sorted(index_of[r] for r in out.request_ids)
        texts.update({index_of[r.request_id]: r.text for r in out.finished})
    damaged = [i for i in range(len(prompts)) if not task.check(prompts[i], texts[i])]
    return ArrivalRun(seed, arrivals, first, damaged)


def format_arrivals(runs: list[ArrivalRun]) -> str:
    lines = []
    for r in runs:
        shown = " ".join(map(str, r.arrivals[:8])) + (" ..." if len(r.arrivals) > 8 else "")
        lines.append(f"  seed {r.seed}: arrivals per step {shown:22s} first batch: requests {ranges(r.first_batch):8s}"
                     f" damaged: {ranges(r.damaged)}")
    return "\n".join(lines)


@dataclass
class WakeRun:
    label: str
    mode: str
    kept_storage: bool                 # the same storage object at the same address after wake_up
    fills_at_wake: int
    uninitialized_scale_slots: int     # scale slots not 1.0 right after wake_up (all are unwritten then)
    damaged_after_wake: list[int]


def sleep_wake_run(label: str, mode: str, prompts, max_num_seqs: int, *, buggy: bool = False,
                   reinit: bool = True, device="cpu", backend="torch") -> WakeRun:
    import minikv
    task = minikv.tasks.for_model("tiny-kvshare")
    llm = minikv.LLM(model="tiny-kvshare", kv_cache_dtype="int8_per_token_head", max_num_seqs=max_num_seqs,
                     device=device, backend=backend, reintroduce=("scale-wipe",) if buggy else ())
    llm.runner.reinit_scales_on_wake = reinit
    params = minikv.SamplingParams(max_tokens=12)
    llm.generate(prompts, params, use_tqdm=False)
    storage, fills = llm.arena.storage.untyped_storage(), len(llm.census.fills)
    address = storage.data_ptr()
    llm.sleep(mode=mode)
    llm.wake_up()
    stale = 0
    for a in llm.runner.self_layers:
        if a.kv_sharing_target is None:
            k, v = llm.runner.layout.scale_views(a.kv_cache)
            stale += int((k != 1).sum() + (v != 1).sum())
    texts = [o.text for o in llm.generate(prompts, params, use_tqdm=False)]
    now = llm.arena.storage.untyped_storage()
    return WakeRun(label, mode, now is storage and now.data_ptr() == address, len(llm.census.fills) - fills, stale,
                   [i for i, (p, t) in enumerate(zip(prompts, texts)) if not task.check(p, t)])


def wake_runs(prompts, max_num_seqs: int, device="cpu", backend="torch") -> list[WakeRun]:
    kw = {"device": device, "backend": backend}
    return [sleep_wake_run("fixed", "discard", prompts, max_num_seqs, **kw),
            sleep_wake_run("fixed", "free", prompts, max_num_seqs, **kw),
            sleep_wake_run("nothing re-initializes", "discard", prompts, max_num_seqs, reinit=False, **kw),
            sleep_wake_run("buggy", "discard", prompts, max_num_seqs, buggy=True, **kw),
            sleep_wake_run("buggy", "free", prompts, max_num_seqs, buggy=True, **kw)]


def format_wake_table(runs: list[WakeRun]) -> str:
    head = (f"{'engine':24s} {'sleep mode':10s} {'storage':15s} {'fills at wake':>13s} "
            f"{'scale slots != 1.0':>18s}  damaged after wake")
    lines = [head, "-" * len(head)]
    for r in runs:
        lines.append(f"{r.label:24s} {r.mode:10s} {('kept (address)' if r.kept_storage else 'new allocation'):15s} {r.fills_at_wake:13d} "
                     f"{r.uninitialized_scale_slots:18,d}  {ranges(r.damaged_after_wake)}")
    return "\n".join(lines)


def check_extra_signatures(warmups: dict[str, list[int]], max_num_seqs: int, wakes: list[WakeRun],
                           unwritten, arrivals: list[ArrivalRun] = ()) -> list[str]:
    problems = []
    for r in arrivals:
        if r.damaged != r.first_batch:
            problems.append(f"arrival seed {r.seed}: first batch {ranges(r.first_batch)}, damaged {ranges(r.damaged)}")
    if arrivals and len({tuple(r.first_batch) for r in arrivals}) < 2:
        problems.append("arrival timing: every seed gave the same first batch")
    if warmups["dummy"] != list(range(max_num_seqs)):
        problems.append(f"dummy warmup: buggy engine damaged {ranges(warmups['dummy'])}")
    if warmups["capture"]:
        problems.append(f"capture warmup: buggy engine damaged {ranges(warmups['capture'])}, expected none")
    for r in wakes:
        tag = f"{r.label}/{r.mode}"
        if r.damaged_after_wake:
            problems.append(f"{tag}: damaged {ranges(r.damaged_after_wake)} after wake_up")
        if r.kept_storage != (r.mode == "discard"):
            problems.append(f"{tag}: storage kept = {r.kept_storage}")
        if r.label == "fixed" and (r.uninitialized_scale_slots or not r.fills_at_wake):
            problems.append(f"{tag}: {r.uninitialized_scale_slots} scale slots not re-initialized")
        if r.label != "fixed" and (r.fills_at_wake or not r.uninitialized_scale_slots):
            problems.append(f"{tag}: expected no fill at wake and uninitialized scale slots")
    for reader, cells in unwritten:
        if reader.startswith("minikv") and set(cells.values()) != {"same"}:
            problems.append(f"{reader} read an unwritten scale slot: {cells}")
        if reader.startswith("whole-block") and cells["NaN (garbage)"] != "NaN":
            problems.append("the whole-block reader was not poisoned by a NaN scale")
    return problems


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

    from minikv.repro import unwritten_slots
    few = prompts[: 2 * seqs]
    warmups = warmup_shape_runs(few, seqs, args.device, args.backend)
    print(f"\nwarmup shape (int8_per_token_head, max_num_seqs={seqs}, buggy engine): damaged requests "
          f"with the dummy warmup: {ranges(warmups['dummy'])}; with the capture-shaped warmup: "
          f"{ranges(warmups['capture'])}")
    wakes = wake_runs(few, seqs, args.device, args.backend)
    print("\nsleep / wake_up (int8_per_token_head; first batch after the wake-up):")
    print(format_wake_table(wakes))
    unwritten = unwritten_slots.run(("torch", "triton"))
    print("\nwho reads a scale slot nobody wrote (output compared with the 1.0-fill output):")
    print(unwritten_slots.format_table(unwritten))
    arrivals = [arrival_run(few, seqs, seed, args.device, args.backend) for seed in range(4)]
    print(f"\narrival timing (buggy engine, max_num_seqs={seqs}, requests arrive 0-{seqs} per step, seeded):")
    print(format_arrivals(arrivals))
    problems += check_extra_signatures(warmups, seqs, wakes, unwritten, arrivals)
    print(f"\n{len(configs)} configurations x (buggy, fixed), {len(prompts)} requests each, "
          f"on {args.device}/{args.backend}, {time.perf_counter() - start:.0f} s")
    if problems:
        print("Signatures NOT reproduced:")
        for line in problems:
            print(f"  - {line}")
        return 1
    print("All upstream signatures reproduced; every fixed run has zero damaged requests.")
    return 0
