"""B1's and B2's signatures, tables, one number per quantity and the JSON results file (`measure` runs all of
it once; `quantities`, `tables` and `results_dict` are what README, docs and notebook 04 quote).
See docs/internals.md#repro-cross-stride-report."""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from minikv.engine.progress import held_warnings

from .arena import ARENA_COLUMNS, Overrun, arena_rows, arena_runs, overrun_facts, wrong_of
from .context_read import ContextRun, run_context
from .run import (
    AUTO_REFERENCE,
    FACTORS,
    MODEL,
    NOTEBOOK,
    RESULTS_COMMAND,
    VERSIONS,
    PoolRun,
    bind_time_check,
    engine,
    identical_requests,
    make_prompts,
    references,
    run_pool,
)


def check_signatures(pool_runs: list[PoolRun], bind_error: str, ctx_runs: list[ContextRun],
                     token_ids_checked: bool = True) -> list[str]:
    """The signatures that did NOT hold. `token_ids_checked=False` (a model whose fp8 rounding moves its tokens):
    the fallback and taught context paths are judged by their attention-output errors alone."""
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
        if r and not (r.context_error < 0.2 and r.decode_error < 0.2 and (r.tokens_equal_auto or not token_ids_checked)):
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
        silent = row[1].outcome + (f" ({len(row[1].wrong)}/{row[1].detail.split('/')[1].split(' ')[0]} requests)"
                                   if row[1].outcome == "wrong tokens" else "")
        lines.append(f"{f:>11.2f}x {row[0].blocks:6d} | {row[0].outcome:24s} {silent:28s} "
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
        lines.append(f"{r.version:14s} {r.path:13s} {error_display(r.context_error):>13s} "
                     f"{error_display(r.decode_error):>13s}  {'yes' if r.tokens_equal_auto else 'no':16s}  {reach}")
    return "\n".join(lines)


def error_display(err: float) -> str:
    """The portable text of a relative error: a band when small, else two significant digits."""
    for bound in (1e-3, 0.1):
        if err < bound:
            return f"< {bound:g}"
    if err < 0.5:
        return f"{err:.1f}"
    return "inf" if math.isinf(err) else f"{float(f'{err:.2g}'):g}"


def factor_key(factor: float) -> str:
    """1.5 -> '1_5x': the pool factor as it appears in quantity names (no '.', which separates results names)."""
    return f"{factor:g}".replace(".", "_") + "x"


@dataclass
class Measurement:
    """Everything `minikv repro cross-stride` measures, as plain data (the notebook reads the same object)."""
    prompts: list[str]
    need: int
    pool_runs: list[PoolRun]
    bind_error: str
    ctx_runs: list[ContextRun]
    copies: list[tuple[int, float, list[int]]]
    overruns: dict[float, list[Overrun]]
    device: str = "cpu"
    backend: str = "torch"
    model: str = MODEL
    reference: str = AUTO_REFERENCE          # what the runs' token ids are compared with (`references`)
    arenas: list = field(default_factory=list)   # `arena_runs` at 1.5x (CPU only: see measure)


def measure(requests: int = 6, device="cpu", backend="torch", progress: bool = False,
            model: str = MODEL) -> Measurement:
    """Run every B1 and B2 case of the repro (about 10 s on CPU with the torch backend, on tiny-t5)."""
    prompts = make_prompts(requests, model=model)
    need = engine("fp8", device, backend, model).cross_blocks_needed(prompts)
    auto, fixed_fp8, reference_kind = references(prompts, need, device, backend, model)
    cases = [(f, b, s) for f in FACTORS for b in (True, False) for s in (True, False)]
    with _held(progress):                               # library warnings: each once, after the bar
        pool_runs = [run_pool(prompts, auto if b else fixed_fp8, f, need, b, s, device, backend, model)
                     for f, b, s in tqdm(cases, desc="cross-pool sizes", disable=not progress)]
    bind_error = bind_time_check(device, model)
    ctx_runs = context_runs(prompts, fixed_fp8, device, backend, model, progress)
    copies = identical_requests(make_prompts(1, seed=2, model=model)[0], device, backend, model)
    overruns = {f: overrun_facts(f, need, device, model) for f in (1.0, 1.5, 2.0)}
    # The per-pool arena allocates each pool exactly on a GPU, where the historical overrun then leaves the
    # allocation: that case runs only under compute-sanitizer, in its own process (tools/memcheck_cross_stride.py).
    arenas = arena_runs(prompts, auto, need, 1.5, device, backend, model) if torch.device(device).type == "cpu" \
        else []
    return Measurement(prompts, need, pool_runs, bind_error, ctx_runs, copies, overruns, str(device), backend,
                       str(model), reference_kind, arenas)


def _held(progress: bool):
    """Warnings held for after the bar while one is drawn; as they come without one (a notebook shows them)."""
    return held_warnings() if progress else contextlib.nullcontext()


def context_runs(prompts, fixed_fp8, device="cpu", backend="torch", model: str = MODEL,
                 progress: bool = False) -> list[ContextRun]:
    """One run per context-path version (B2), behind a bar when `progress`; the fallback's configuration warning
    comes once, after the bar."""
    with _held(progress):
        return [run_context(prompts, fixed_fp8, v, device, backend, model)
                for v in tqdm(VERSIONS, desc="context paths", disable=not progress)]


def quantities(m: Measurement) -> dict[str, dict]:
    """The single figures the prose quotes: {name: {"value", "display", "statistic"}}."""
    n = len(m.prompts)
    silent = {r.factor: r for r in m.pool_runs if r.buggy and not r.sanitize}
    by = {r.version: r for r in m.ctx_runs}
    safe = min(r.factor for r in m.pool_runs if r.buggy and r.outcome == "correct"
               and all(s.outcome == "correct" for s in m.pool_runs if s.buggy and s.factor >= r.factor))
    q = {
        "cross_blocks_needed": {"value": m.need, "display": str(m.need),
                                "statistic": f"cross blocks the {n} requests hold at once (one block table per "
                                             "request, shared by every cross layer)"},
        "buggy_safe_pool_factor": {"value": safe, "display": f"{safe:g}x",
                                   "statistic": "smallest pool factor of the grid from which every buggy run "
                                                "(sanitizer on and off) equals the auto-cache run"},
    }
    for f in (1.0, 1.5, 2.0):
        r = silent[f]
        q[f"b1_wrong_requests_{factor_key(f)}"] = {
            "value": len(r.wrong), "display": wrong_of(r.wrong, n),
            "statistic": f"requests whose token ids differ from the auto-cache run, historical stride, cross pool "
                         f"of {r.blocks} blocks ({f:g}x the {m.need} needed), sanitizer off"}
    o15 = m.overruns[1.5]
    q["b1_bytes_past_pool_1_5x"] = {
        "value": o15[0].bytes_past_end, "display": f"{o15[0].bytes_past_end:,} bytes",
        "statistic": "bytes between a cross pool's end and the end of the highest block in use at the doubled "
                     "stride, 1.5x pool (the same for every cross layer)"}
    q["b1_overrun_lands_in_1_5x"] = {
        "value": [o.lands_in for o in o15], "display": ", ".join(f"{o.pool} -> {o.lands_in}" for o in o15),
        "statistic": "per cross layer, the arena region holding the last byte of the highest block in use at "
                     "the doubled stride, 1.5x pool"}
    hist = by["historical"]
    q["b2_context_error"] = {
        "value": hist.context_error, "display": error_display(hist.context_error),
        "statistic": "historical fused context read: max over requests and cross layers of max|out - exact| / "
                     "max|exact| of the cross-attention output at the context step (exact: float32 attention "
                     "over the K/V the path is meant to read, here the FP8 cache's dequantized contents)"}
    q["b2_decode_error"] = {
        "value": hist.decode_error, "display": error_display(hist.decode_error),
        "statistic": "the same statistic over every decode step of the historical run (16-bit arithmetic "
                     "only: the decode kernel reads the pool with its real layout)"}
    for v in ("fallback", "taught-fused"):
        q[f"b2_context_error_{v.replace('-', '_')}"] = {
            "value": by[v].context_error, "display": error_display(by[v].context_error),
            "statistic": f"the same statistic at the context step, {v} path"}
    q["b2_wrong_requests"] = {
        "value": len(hist.wrong), "display": wrong_of(hist.wrong, n),
        "statistic": "requests whose token ids differ from the auto-cache run with the historical context read"}
    first = [round(f, 2) for _, f, d in m.copies if 0 in d]
    factors = [round(f, 2) for _, f, _ in m.copies]
    # A range when the factors at which it differs are consecutive in the grid ("1.00x-1.78x"), else each of them.
    contiguous = bool(first) and factors[factors.index(first[0]):factors.index(first[0]) + len(first)] == first
    shown = ("never" if not first else f"{first[0]:.2f}x" if len(first) == 1 else
             f"{first[0]:.2f}x-{first[-1]:.2f}x" if contiguous else ", ".join(f"{f:.2f}x" for f in first))
    q["identical_requests_first_copy_differs"] = {
        "value": first, "display": shown,
        "statistic": "three identical requests, historical stride, sanitizer off: pool factors (1x..2x, one "
                     "block at a time) at which the first copy's token ids differ from the auto-cache run"}
    return q


def tables(m: Measurement) -> dict[str, dict]:
    n = len(m.prompts)
    cell = {(r.factor, r.buggy, r.sanitize): r for r in m.pool_runs}
    b1 = {"caption": f"B1: fp8 cross pool sized as a multiple of the {m.need} blocks {n} requests need at once; "
                     "outcome per engine (wrong: requests whose token ids differ from the auto-cache run)",
          "columns": ["pool factor", "blocks", "buggy, sanitizer on", "buggy, sanitizer off", "fixed, sanitizer on",
                      "fixed, sanitizer off"], "rows": []}
    for f in FACTORS:
        row = [cell[(f, b, s)] for b, s in ((True, True), (True, False), (False, True), (False, False))]
        b1["rows"].append([f"{f:g}x", row[0].blocks] + [
            r.outcome + (f" ({wrong_of(r.wrong, n)})" if r.outcome == "wrong tokens" else "") for r in row])
    b2 = {"caption": "B2: cross-attention output vs exact float32 attention over the K/V the path is meant to "
                     "read (the FP8 cache's contents; the 16-bit K/V for the unfused path), max |out - exact| / "
                     "max |exact| over requests and cross layers",
          "columns": ["version", "context path", "context step", "decode steps", "wrong requests"],
          "rows": [[r.version, r.path, error_display(r.context_error), error_display(r.decode_error),
                    wrong_of(r.wrong, n)] for r in m.ctx_runs]}
    over = {"caption": "B1: where each cross layer's highest block in use ends at the doubled stride",
            "columns": ["pool factor", "cross pool", "bytes past its end", "last byte lands in"],
            "rows": [[f"{f:g}x", o.pool, o.bytes_past_end, o.lands_in] for f, os in m.overruns.items() for o in os]}
    same = {"caption": "three identical requests, historical stride, sanitizer off: copies whose token ids differ "
                       "from the auto-cache run",
            "columns": ["blocks", "pool factor", "copies differing"],
            "rows": [[b, f"{f:.2f}x", ", ".join(map(str, d)) or "none"] for b, f, d in m.copies]}
    out = {"b1_pool_sizes": b1, "b2_context_read": b2, "b1_overrun_reach": over, "identical_requests": same}
    if m.arenas:
        out["b1_arena_allocation"] = {
            "caption": f"B1 at 1.5x the {m.need} blocks needed, historical stride, by how the pools are allocated "
                       "(CPU: a per-pool allocation carries its own guard; on a GPU it is exact, see results/gpu/"
                       "memcheck/ for compute-sanitizer's report)",
            "columns": ARENA_COLUMNS, "rows": arena_rows(m.arenas, n)}
    return out


def results_dict(m: Measurement, command: str = RESULTS_COMMAND) -> dict:
    """The results file (RESULTS_SCHEMA.md): name, command, model, the notebook that prints it, quantities,
    tables."""
    return {"name": "cross_stride", "command": command, "model": m.model, "notebook": NOTEBOOK,
            "quantities": quantities(m), "tables": tables(m)}


def write_results(m: Measurement, path, command: str = RESULTS_COMMAND) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results_dict(m, command), indent=2) + "\n")
