"""`minikv repro cross-stride`: defects B1 (cross-stride) and B2 (cross-fp8-context-read) on tiny-encdec.

B1 table. The same requests run with an fp8 cache on cross pools of 0.75, 1, 1.5, 1.99, 2 and 3 times the blocks
they need at once, buggy (`reintroduce=("cross-stride",)`, layout contract off so the bind succeeds as it did
upstream) and fixed, with the arena's sanitizer on and off. Outcomes: "correct" (token ids equal the auto-cache
run), "overrun caught" (KVCacheOverrunError naming the cross pool), "wrong tokens" (the overrun landed on live data),
"correct, guard hit" (sanitizer off: the overrun happened but landed only in a guard zone, harming nothing). Plus the layout contract
catching the buggy backend at bind time.

B2 table. With the addressing fixed, the cross-attention output of every step is compared with attention over
the exact encoder K/V: the historical fused path (reads the fp8 bytes of the right blocks as 16-bit elements
unless paged_context is on), the upstream fallback (unfused context path), and minikv's fused path taught the
cache format. The last column is the farthest pool byte the fused context read addresses: inside the pool.

Exit status 0 only if: buggy pools >= 2x are correct and smaller ones overrun (caught with the sanitizer on,
wrong tokens with it off), never outside the arena; the layout contract raises at bind; the historical context
read is wrong at the context step and right at decode steps; every fixed run equals the auto-cache run.
"""
from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

FACTORS = (0.75, 1.0, 1.5, 1.99, 2.0, 3.0)


def make_prompts(n: int = 6, seed: int = 0) -> list[str]:
    import minikv
    return minikv.tasks.for_model("tiny-encdec").prompts(n, seed=seed)


def _generate(llm, prompts):
    import minikv
    task = minikv.tasks.for_model("tiny-encdec")
    params = [minikv.SamplingParams(max_tokens=task.max_tokens(p)) for p in prompts]
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def reference_tokens(prompts, device="cpu", backend="triton") -> list[list[int]]:
    import minikv
    return _generate(minikv.LLM(model="tiny-encdec", kv_cache_dtype="auto", max_num_seqs=len(prompts),
                                device=device, backend=backend), prompts)


@dataclass
class PoolRun:
    factor: float
    blocks: int
    buggy: bool
    sanitize: bool
    outcome: str          # "correct" | "overrun caught" | "wrong tokens" | "correct, guard hit"
    detail: str = ""


def run_pool(prompts, reference, factor: float, need: int, buggy: bool, sanitize: bool, device="cpu",
             backend="triton") -> PoolRun:
    import minikv
    blocks = max(1, math.floor(factor * need))
    llm = minikv.LLM(model="tiny-encdec", kv_cache_dtype="fp8", max_num_seqs=len(prompts),
                     cross_pool_blocks=blocks, device=device, backend=backend, sanitize=sanitize,
                     check_layout=False, reintroduce=("cross-stride",) if buggy else ())
    try:
        tokens = _generate(llm, prompts)
    except minikv.KVCacheOverrunError as err:
        return PoolRun(factor, blocks, buggy, sanitize, "overrun caught", f"pool {err.pool!r}")
    damage = llm.arena.damaged_guards()
    where = f"guard bytes written after {', '.join(d[0] for d in damage)}" if damage else ""
    if tokens == reference:
        # With the sanitizer off an overrun that stays inside a guard zone harms nothing, but it still happened.
        return PoolRun(factor, blocks, buggy, sanitize, "correct, guard hit" if damage else "correct", where)
    wrong = sum(t != r for t, r in zip(tokens, reference))
    return PoolRun(factor, blocks, buggy, sanitize, "wrong tokens", f"{wrong}/{len(prompts)} requests; {where}")


def identical_requests(prompt: str, device="cpu", backend="torch") -> list[tuple[int, float, list[int]]]:
    """Three copies of one request, buggy, sanitizer off, on cross pools from 1x to 2x the blocks they need:
    [(blocks, factor, indices of the copies whose token ids differ from the auto-cache run)]."""
    import minikv
    prompts = [prompt] * 3
    reference = reference_tokens(prompts, device, backend)
    need = minikv.LLM(model="tiny-encdec", kv_cache_dtype="fp8", device=device,
                      backend=backend).cross_blocks_needed(prompts)
    rows = []
    for blocks in range(need, 2 * need + 1):
        llm = minikv.LLM(model="tiny-encdec", kv_cache_dtype="fp8", max_num_seqs=3, cross_pool_blocks=blocks,
                         device=device, backend=backend, sanitize=False, check_layout=False,
                         reintroduce=("cross-stride",))
        tokens = _generate(llm, prompts)
        rows.append((blocks, blocks / need, [i for i, (t, r) in enumerate(zip(tokens, reference)) if t != r]))
    return rows


def bind_time_check(device="cpu") -> str:
    """With the layout contract on, the buggy cross backend must fail when it is bound to its pool."""
    import minikv
    try:
        minikv.LLM(model="tiny-encdec", kv_cache_dtype="fp8", reintroduce=("cross-stride",), device=device)
    except minikv.KVLayoutMismatchError as err:
        return str(err)
    return ""


@dataclass
class ContextRun:
    version: str
    context_error: float     # max relative error of the cross-attention output at the context step
    decode_error: float      # the same over all decode steps
    path: str                # which context path ran
    tokens_equal_auto: bool
    read_end: int = 0        # one past the farthest pool byte the context step's read layout addresses
    pool_bytes: int = 0


def read_extent(layout, block_table_row, length: int) -> int:
    """One past the farthest byte (from the pool start) a paged reader with `layout` touches for one sequence."""
    from minikv.kernels.addressing import row_byte_offsets, sequence_slots
    slots = sequence_slots(block_table_row, length, layout.block_size)
    return int(row_byte_offsets(layout, slots, 1).max()) + layout.head_size * layout.elem_bytes


def _attend_exact(q, k, v, sm_scale):
    """Non-causal attention of q [n, Hq, D] over k, v [S, Hkv, D] in float32."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.float(), k) * sm_scale
    return torch.einsum("hns,shd->nhd", scores.softmax(-1), v)


def run_context(prompts, reference, version: str, device="cpu", backend="triton") -> ContextRun:
    """Drive the engine step by step, capturing every cross layer's q, k, v and output, and compare each step's
    output with exact attention; record how far into the pool the fused context read reaches."""
    import minikv
    kwargs = {"historical": dict(reintroduce=("cross-fp8-context-read",)),
              "fallback": dict(cross_context_path="fallback"),
              "taught-fused": dict(cross_context_path="fused")}[version]
    llm = minikv.LLM(model="tiny-encdec", kv_cache_dtype="fp8", max_num_seqs=len(prompts), device=device,
                     backend=backend, **kwargs)
    encoder_kv: dict = {}
    errors = {True: [0.0], False: [0.0]}
    paths = set()
    extent = [0]

    task = minikv.tasks.for_model("tiny-encdec")
    ids = [llm.add_request(p, minikv.SamplingParams(max_tokens=task.max_tokens(p))) for p in prompts]
    results = {}
    while llm.has_unfinished():
        out = llm.step(capture=True)          # every cross layer's q, k, v and output, per step
        is_prefill = out.is_prefill
        q_lens = [len(out.slot_mapping[rid]) for rid in out.request_ids]
        enc_lens = [len(out.cross_slot_mapping[rid]) for rid in out.request_ids] if is_prefill else []
        for e in out.trace.events:
            if e.kind != "cross":
                continue
            t = e.tensors
            qa = ea = 0
            for i, rid in enumerate(out.request_ids):
                key = (e.layer, out.cross_block_tables[rid])
                if is_prefill:
                    encoder_kv[key] = (t["k"][ea:ea + enc_lens[i]], t["v"][ea:ea + enc_lens[i]])
                    ea += enc_lens[i]
                    paths.add(e.context_path)
                    if e.context_path == "fused":
                        read = llm.runner.by_name[e.layer].impl._context_read_layout()
                        table = torch.tensor(out.cross_block_tables[rid])
                        extent[0] = max(extent[0], read_extent(read, table, enc_lens[i]))
                kk, vv = encoder_kv[key]
                q = t["q"][qa:qa + q_lens[i]]
                ref = _attend_exact(q, kk, vv, q.shape[-1] ** -0.5)
                got = t["out"][qa:qa + q_lens[i]].float()
                qa += q_lens[i]
                err = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
                errors[is_prefill].append(err if math.isfinite(err) else float("inf"))
        results.update({r.request_id: r.token_ids for r in out.finished})
    tokens = [results[i] for i in ids]
    return ContextRun(version, max(errors[True]), max(errors[False]), "/".join(sorted(paths)),
                      tokens == reference, extent[0], llm.runner.cross_layers[0].kv_cache.numel())


def check_signatures(pool_runs: list[PoolRun], bind_error: str, ctx_runs: list[ContextRun]) -> list[str]:
    problems = []
    for r in pool_runs:
        tag = f"{'buggy' if r.buggy else 'fixed'} {r.factor}x ({r.blocks} blocks) sanitize={r.sanitize}"
        if not r.buggy or r.factor >= 2:
            if r.outcome != "correct":
                problems.append(f"{tag}: {r.outcome}, expected correct")
        elif r.sanitize and r.outcome != "overrun caught":
            problems.append(f"{tag}: {r.outcome}, expected the overrun to be caught")
        elif not r.sanitize and r.outcome not in ("wrong tokens", "correct, guard hit"):
            problems.append(f"{tag}: {r.outcome}, expected an overrun (wrong tokens where it lands on live data)")
    silent = [r for r in pool_runs if r.buggy and not r.sanitize and r.factor < 2]
    if silent and not any(r.outcome == "wrong tokens" for r in silent):
        problems.append("no buggy run with the sanitizer off produced silently wrong tokens")
    if "mismatch" not in bind_error:
        problems.append("the layout contract did not reject the buggy cross backend at bind time")
    by = {r.version: r for r in ctx_runs}
    hist = by.get("historical")
    if hist and not (hist.context_error > 0.5 and hist.decode_error < 0.2):
        problems.append(f"historical context read: context error {hist.context_error:.3g}, decode error "
                        f"{hist.decode_error:.3g}; expected a wrong context step and right decode steps")
    if hist and not 0 < hist.read_end <= hist.pool_bytes:
        problems.append(f"historical context read reached byte {hist.read_end} of a {hist.pool_bytes}-byte pool")
    for name in ("fallback", "taught-fused"):
        r = by.get(name)
        if r and not (r.context_error < 0.2 and r.decode_error < 0.2 and r.tokens_equal_auto):
            problems.append(f"{name}: context {r.context_error:.3g}, decode {r.decode_error:.3g}, tokens equal "
                            f"auto: {r.tokens_equal_auto}")
    return problems


def format_tables(need: int, pool_runs, bind_error, ctx_runs) -> str:
    lines = [f"B1 cross-stride: fp8 cross pool sized as a multiple of the {need} blocks the requests need at once",
             f"{'pool':>12s} {'blocks':>6s} | {'buggy, sanitizer on':24s} {'buggy, sanitizer off':28s} "
             f"{'fixed, sanitizer on':20s} {'fixed, sanitizer off':20s}"]
    lines.append("-" * len(lines[-1]))
    cell = {(r.factor, r.buggy, r.sanitize): r for r in pool_runs}
    for f in sorted({r.factor for r in pool_runs}):
        row = [cell[(f, b, s)] for b, s in ((True, True), (True, False), (False, True), (False, False))]
        lines.append(f"{f:>11.2f}x {row[0].blocks:6d} | {row[0].outcome:24s} "
                     f"{(row[1].outcome + (' (' + row[1].detail.split(';')[0] + ')' if row[1].outcome == 'wrong tokens' else '')):28s} "
                     f"{row[2].outcome:20s} {row[3].outcome:20s}")
    lines.append(f"layout contract on (the default), buggy backend: "
                 f"{'KVLayoutMismatchError at bind' if bind_error else 'NOT caught'}")
    if bind_error:
        lines.append(f"  {bind_error[:200]}...")
    lines += ["", "B2 cross-fp8-context-read: cross-attention output vs exact attention (max relative error)",
              f"{'version':14s} {'context path':13s} {'context step':>13s} {'decode steps':>13s}  token ids = auto"
              f"  fused read reaches"]
    lines.append("-" * len(lines[-1]))
    for r in ctx_runs:
        reach = f"byte {r.read_end:,} of {r.pool_bytes:,}" if r.read_end else "-"
        lines.append(f"{r.version:14s} {r.path:13s} {r.context_error:13.2f} {r.decode_error:13.2f}  "
                     f"{'yes' if r.tokens_equal_auto else 'no':16s}  {reach}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minikv repro cross-stride", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default=None, choices=("triton", "torch"),
                   help="kernel backend (default: triton on cuda; torch on cpu, where the Triton interpreter would "
                        "take many minutes: the defect lives in the engine's Python, which both backends run)")
    p.add_argument("--requests", type=int, default=6)
    args = p.parse_args(argv)
    args.backend = args.backend or ("triton" if args.device.startswith("cuda") else "torch")
    import minikv

    start = time.perf_counter()
    prompts = make_prompts(args.requests)
    probe_llm = minikv.LLM(model="tiny-encdec", kv_cache_dtype="fp8", device=args.device, backend=args.backend)
    need = probe_llm.cross_blocks_needed(prompts)
    del probe_llm
    reference = reference_tokens(prompts, args.device, args.backend)
    cases = [(f, b, s) for f in FACTORS for b in (True, False) for s in (True, False)]
    pool_runs = [run_pool(prompts, reference, f, need, b, s, args.device, args.backend)
                 for f, b, s in tqdm(cases, desc="cross-pool sizes")]
    bind_error = bind_time_check(args.device)
    ctx_runs = [run_context(prompts, reference, v, args.device, args.backend)
                for v in tqdm(("historical", "fallback", "taught-fused"), desc="context paths")]
    print(format_tables(need, pool_runs, bind_error, ctx_runs))
    problems = check_signatures(pool_runs, bind_error, ctx_runs)
    copies = identical_requests(make_prompts(1, seed=2)[0], args.device, args.backend)   # 2 cross blocks each
    print("\nthree identical requests, B1 reintroduced, sanitizer off: copies whose token ids differ from auto")
    print("  " + "; ".join(f"{b} blocks ({f:.2f}x): {', '.join(map(str, d)) or 'none'}" for b, f, d in copies))
    if not any(0 in d for _, f, d in copies if f < 2) or any(d for _, f, d in copies if f >= 2):
        problems.append("identical requests: the first copy never differed below 2x, or a copy differed at 2x")
    print(f"\n{len(prompts)} requests, {len(cases)} pool runs + 3 context runs on {args.device}/{args.backend}, "
          f"{time.perf_counter() - start:.0f} s")
    if problems:
        print("Signatures NOT reproduced:")
        for line in problems:
            print(f"  - {line}")
        return 1
    print("All signatures reproduced; every fixed run equals the auto-cache run.")
    return 0
