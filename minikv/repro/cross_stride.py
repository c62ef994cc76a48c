"""`minikv repro cross-stride`: defects B1 (cross-stride) and B2 (cross-fp8-context-read) on tiny-t5.

`--model DIR` runs the same on a T5 checkpoint directory in transformers' format (e.g. flan-t5-base, with its
own tokenizer.json; prompts from `minikv.tasks.for_checkpoint`, which adapts them to the tokenizer). Every
signature compares token ids with the auto-cache run, so it needs no right/wrong answers.

tiny-t5 is a T5 (3 encoder + 3 decoder layers, so three cross-attention layers, each with its own cross pool). It
runs here as a 16-bit model (float16 on CPU, bfloat16 on CUDA), as flan-t5-base did upstream: the historical
cross backend addresses a 1-byte fp8 pool at the model's element size, 2 bytes. (A float32 model would address it
at 4 bytes, and take the unfused context path, where B2 cannot happen.)

B1 table. The same requests run with an fp8 cache on cross pools of 0.75, 1, 1.5, 1.99, 2 and 3 times the blocks
they need at once, buggy (`reintroduce=("cross-stride",)`, layout contract off so the bind succeeds as it did
upstream) and fixed, with the arena's sanitizer on and off. Outcomes: "correct" (token ids equal the auto-cache
run), "overrun caught" (KVCacheOverrunError naming the cross pool), "wrong tokens" (the overrun landed on live data),
"correct, guard hit" (sanitizer off: the overrun happened but landed only in a guard zone, harming nothing). Plus the
layout contract catching the buggy backend at bind time.

B2 table. With the addressing fixed, the cross-attention output of every step is compared with attention over
the exact encoder K/V: the historical fused path (reads the fp8 bytes of the right blocks as 16-bit elements
unless paged_context is on), the upstream fallback (unfused context path), and minikv's fused path taught the
cache format. The last column is the farthest pool byte the fused context read addresses: inside the pool.

Exit status 0 only if: buggy pools >= 2x are correct and smaller ones overrun (caught with the sanitizer on,
wrong tokens with it off), never outside the arena; the layout contract raises at bind; the historical context
read is wrong at the context step and right at decode steps; every fixed run equals the auto-cache run.

`--results PATH` also writes the measured quantities and tables as JSON (results/cross_stride.json; its shape is
described in `results_dict`); notebook 04 prints the same `display` strings from the same functions.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from minikv.repro.common import dequantized_rows

MODEL = "tiny-t5"
FACTORS = (0.75, 1.0, 1.5, 1.99, 2.0, 3.0)
VERSIONS = ("historical", "fallback", "taught-fused")
RESULTS_COMMAND = "minikv repro cross-stride --results results/cross_stride.json"
NOTEBOOK = "notebooks/04_cross_attention_stride_doubling.ipynb"     # prints every quantity's display


def model_dtype(device="cpu") -> torch.dtype:
    """The 16-bit dtype tiny-t5 runs in here: float16 on CPU (the Triton interpreter has no bfloat16), bfloat16 on
    CUDA. tiny-t5's own default on CPU is float32, which would hide B2 (float32 always takes the unfused path)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float16


def engine(kv_cache_dtype: str = "fp8", device="cpu", backend="triton", model: str = MODEL, **kwargs):
    """A tiny-t5 (or `model`) engine in the 16-bit model dtype; kwargs go to `minikv.LLM` (and may override
    `dtype`)."""
    import minikv
    kwargs.setdefault("dtype", model_dtype(device))
    return minikv.LLM(model=model, kv_cache_dtype=kv_cache_dtype, device=device, backend=backend, **kwargs)


def task_of(model: str = MODEL):
    """tiny-t5's task, or for a T5 checkpoint directory the task `minikv.tasks.for_checkpoint` fits to its
    tokenizer."""
    import minikv
    from minikv.models import registry
    if registry.is_checkpoint_model(model):
        return minikv.tasks.for_model(model)
    return minikv.tasks.for_checkpoint(registry.get_tokenizer(model), model=str(model), encoder_decoder=True)


def make_prompts(n: int = 6, seed: int = 0, model: str = MODEL) -> list[str]:
    return task_of(model).prompts(n, seed=seed)


def _generate(llm, prompts):
    import minikv
    task = task_of(llm.model_name)
    params = [minikv.SamplingParams(max_tokens=task.max_tokens(p)) for p in prompts]
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def reference_tokens(prompts, device="cpu", backend="triton", model: str = MODEL) -> list[list[int]]:
    return _generate(engine("auto", device, backend, model, max_num_seqs=len(prompts)), prompts)


AUTO_REFERENCE = "the auto-cache run"
SPLIT_REFERENCE = ("buggy runs: the buggy engine on a pool of 3x the blocks needed, where nothing overruns; fixed "
                   "runs: the fixed fp8 engine on an automatically sized pool (an fp8 cache itself changes this "
                   "model's tokens, so no run equals the auto-cache run)")


def references(prompts, need: int, device="cpu", backend="triton", model: str = MODEL) -> tuple[list, list, str]:
    """(token ids a buggy B1 run is compared with, those a fixed run is compared with, what they are).

    Upstream's reference is the default (16-bit) cache run, which the fixed fp8 engine equals on a trained model
    (tiny-t5, and flan-t5-base upstream): one reference. A model whose fp8 rounding alone moves its greedy tokens
    (random weights have near-tied logits) gets two: a buggy run is compared with the same buggy engine on a pool of
    3x the blocks needed, where the doubled stride stays inside the pool (so a smaller pool's difference is the
    overrun's doing), and a fixed run with the fixed fp8 engine on the automatically sized pool (its answers do not
    depend on the pool's size)."""
    import minikv
    auto = reference_tokens(prompts, device, backend, model)
    fp8 = _generate(engine("fp8", device, backend, model, max_num_seqs=len(prompts)), prompts)
    if fp8 == auto:
        return auto, auto, AUTO_REFERENCE
    ample = engine("fp8", device, backend, model, max_num_seqs=len(prompts), cross_pool_blocks=3 * need,
                   repro=minikv.ReproConfig(check_layout=False), reintroduce=("cross-stride",))
    return _generate(ample, prompts), fp8, SPLIT_REFERENCE


@dataclass
class PoolRun:
    factor: float
    blocks: int
    buggy: bool
    sanitize: bool
    outcome: str          # "correct" | "overrun caught" | "wrong tokens" | "correct, guard hit"
    detail: str = ""
    wrong: list[int] = field(default_factory=list)     # requests whose token ids differ from the auto-cache run


def run_pool(prompts, reference, factor: float, need: int, buggy: bool, sanitize: bool, device="cpu",
             backend="triton", model: str = MODEL, kv_arena: str = "one") -> PoolRun:
    import minikv
    blocks = max(1, math.floor(factor * need))
    llm = engine("fp8", device, backend, model, max_num_seqs=len(prompts), cross_pool_blocks=blocks,
                 sanitize=sanitize, reintroduce=("cross-stride",) if buggy else (),
                 repro=minikv.ReproConfig(check_layout=False, kv_arena=kv_arena))
    try:
        tokens = _generate(llm, prompts)
    except minikv.KVCacheOverrunError as err:
        return PoolRun(factor, blocks, buggy, sanitize, "overrun caught", f"pool {err.pool!r}")
    damage = llm.arena.damaged_guards()
    where = f"guard bytes written after {', '.join(d[0] for d in damage)}" if damage else ""
    if tokens == reference:
        # With the sanitizer off an overrun that stays inside a guard zone harms nothing, but it still happened.
        return PoolRun(factor, blocks, buggy, sanitize, "correct, guard hit" if damage else "correct", where)
    wrong = [i for i, (t, r) in enumerate(zip(tokens, reference)) if t != r]
    return PoolRun(factor, blocks, buggy, sanitize, "wrong tokens", f"{len(wrong)}/{len(prompts)} requests; {where}",
                   wrong)


def identical_requests(prompt: str, device="cpu", backend="torch",
                       model: str = MODEL) -> list[tuple[int, float, list[int]]]:
    """Three copies of one request, buggy, sanitizer off, on cross pools from 1x to 2x the blocks they need:
    [(blocks, factor, indices of the copies whose token ids differ from the reference run)] (`references`)."""
    import minikv
    prompts = [prompt] * 3
    need = engine("fp8", device, backend, model).cross_blocks_needed(prompts)
    reference = references(prompts, need, device, backend, model)[0]
    rows = []
    for blocks in range(need, 2 * need + 1):
        llm = engine("fp8", device, backend, model, max_num_seqs=3, cross_pool_blocks=blocks, sanitize=False,
                     repro=minikv.ReproConfig(check_layout=False), reintroduce=("cross-stride",))
        tokens = _generate(llm, prompts)
        rows.append((blocks, blocks / need, [i for i, (t, r) in enumerate(zip(tokens, reference)) if t != r]))
    return rows


def bind_time_check(device="cpu", model: str = MODEL) -> str:
    """With the layout contract on, the buggy cross backend must fail when it is bound to its pool."""
    import minikv
    try:
        engine("fp8", device, model=model, reintroduce=("cross-stride",))
    except minikv.KVLayoutMismatchError as err:
        return str(err)
    return ""


@dataclass
class ContextRun:
    version: str
    context_error: float     # `relative_error` of the cross-attention output at the context step (max over all)
    decode_error: float      # the same over all decode steps
    path: str                # which context path ran
    tokens_equal_auto: bool
    read_end: int = 0        # one past the farthest pool byte the context step's read layout addresses
    pool_bytes: int = 0
    wrong: list[int] = field(default_factory=list)                     # requests whose token ids differ from auto
    samples: list[tuple[float, float]] = field(default_factory=list)   # (exact, got) pairs at the context step


def read_extent(layout, block_table_row, length: int) -> int:
    """One past the farthest byte (from the pool start) a paged reader with `layout` touches for one sequence."""
    from minikv.kernels.addressing import row_byte_offsets, sequence_slots
    slots = sequence_slots(block_table_row, length, layout.block_size)
    return int(row_byte_offsets(layout, slots, 1).max()) + layout.head_size * layout.elem_bytes


def _attend_exact(q, k, v, sm_scale):
    """Non-causal attention of q [n, Hq, D] over k, v [S, Hkv, D] in float32 (T5: sm_scale 1, no bias)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.float(), k) * sm_scale
    return torch.einsum("hns,shd->nhd", scores.softmax(-1), v)


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """max |got - exact| / max |exact|: the statistic of every B2 error (inf when `got` holds inf or NaN)."""
    err = float((got.float() - exact).abs().max() / exact.abs().max().clamp_min(1e-12))
    return err if math.isfinite(err) else float("inf")


def run_context(prompts, reference, version: str, device="cpu", backend="triton", model: str = MODEL) -> ContextRun:
    """Drive the engine step by step, capturing every cross layer's q, k, v and output, and compare each step's
    output with exact attention; record how far into the pool the fused context read reaches."""
    import minikv
    kwargs = {"historical": dict(reintroduce=("cross-fp8-context-read",)),
              "fallback": dict(repro=minikv.ReproConfig(cross_context_path="fallback")),
              "taught-fused": dict(repro=minikv.ReproConfig(cross_context_path="fused"))}[version]
    llm = engine("fp8", device, backend, model, max_num_seqs=len(prompts), **kwargs)
    encoder_kv: dict = {}
    errors = {True: [0.0], False: [0.0]}
    paths = set()
    extent = [0]
    samples = []

    task = task_of(model)
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
            impl = llm.attention_layers[e.layer].impl
            qa = ea = 0
            for i, rid in enumerate(out.request_ids):
                key = (e.layer, out.cross_block_tables[rid])
                if is_prefill:
                    slots = out.cross_slot_mapping[rid]
                    cached = dequantized_rows(llm.arena.layout(e.pool), llm.arena.pool(e.pool), list(slots))
                    encoder_kv[key] = {"unfused": (t["k"][ea:ea + enc_lens[i]], t["v"][ea:ea + enc_lens[i]]),
                                       "paged": cached}
                    ea += enc_lens[i]
                    paths.add(e.context_path)
                    if e.context_path == "fused":
                        read = e.read_layout            # what the fused kernel was told the pool holds
                        table = torch.tensor(out.cross_block_tables[rid])
                        extent[0] = max(extent[0], read_extent(read, table, enc_lens[i]))
                # The reference is what this path is meant to read: the 16-bit workspace K/V for the unfused
                # context path, the cache's FP8 contents (dequantized with the pool's layout) for paged reads.
                # Against the 16-bit K/V, FP8 rounding alone moves T5's unscaled, near-argmax attention a lot.
                unfused = is_prefill and e.context_path == "unfused"
                kk, vv = encoder_kv[key]["unfused" if unfused else "paged"]
                q = t["q"][qa:qa + q_lens[i]]
                ref = _attend_exact(q, kk, vv, impl.sm_scale)
                got = t["out"][qa:qa + q_lens[i]].float()
                qa += q_lens[i]
                errors[is_prefill].append(relative_error(got, ref))
                if is_prefill:
                    samples += list(zip(ref.flatten().tolist(), got.flatten().tolist()))
        results.update({r.request_id: r.token_ids for r in out.finished})
    tokens = [results[i] for i in ids]
    wrong = [i for i, (t, r) in enumerate(zip(tokens, reference)) if t != r]
    cross_pool = next(a.kv_cache for a in llm.attention_layers.values() if a.kind == "cross")
    return ContextRun(version, max(errors[True]), max(errors[False]), "/".join(sorted(paths)),
                      tokens == reference, extent[0], cross_pool.numel(), wrong, samples)


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


@dataclass
class Overrun:
    """Where one cross layer's highest block in use ends with the historical stride, in one buggy arena."""
    pool: str
    bytes_past_end: int      # 0 when the block ends inside the pool
    lands_in: str            # the region holding the block's last byte: the pool itself, "guard after X", or a pool


def overrun_facts(factor: float, need: int, device="cpu", model: str = MODEL) -> list[Overrun]:
    """For a cross pool of floor(factor * need) blocks: per cross layer, how far past its pool the historical
    layout puts the end of block need - 1 (the highest block the requests hold), and what lies there."""
    import minikv
    llm = engine("fp8", device, "torch", model, cross_pool_blocks=max(1, math.floor(factor * need)),
                 reintroduce=("cross-stride",), repro=minikv.ReproConfig(check_layout=False))
    arena = llm.arena
    facts = []
    for a in [a for a in llm.attention_layers.values() if a.kind == "cross"]:
        name = a.pool
        start = arena.offsets[name]
        end = start + a.impl.layout.row_offset(need, 0, 0, 0)          # the historical (16-bit) block stride
        pool_end = start + arena.pool(name).numel()
        region = next(r for r in arena.byte_map() if r[2] <= end - 1 < r[3])
        lands = region[1] if region[0] == "pool" else f"guard after {region[1]}"
        facts.append(Overrun(name, max(0, end - pool_end), lands))
    return facts


def byte_arrangement(prompts, reference, factor: float, need: int, device="cpu", backend="torch",
                     model: str = MODEL) -> dict:
    """Serve `prompts` on a buggy engine (historical stride, sanitizer off) with a cross pool of
    floor(factor * need) blocks and return one panel of `minikv.viz_cross_stride.stride_byte_map`: the arena's
    regions, every cross layer's blocks in use at the doubled stride per request, the requests' self-attention
    blocks, and the requests whose token ids differ from `reference`."""
    import minikv
    blocks = max(1, math.floor(factor * need))
    llm = engine("fp8", device, backend, model, max_num_seqs=len(prompts), cross_pool_blocks=blocks, sanitize=False,
                 repro=minikv.ReproConfig(check_layout=False), reintroduce=("cross-stride",))
    task = task_of(model)
    ids = [llm.add_request(p, minikv.SamplingParams(max_tokens=task.max_tokens(p))) for p in prompts]
    cross_tables, self_tables, done = {}, {}, {}
    while llm.has_unfinished():
        out = llm.step()
        for rid in out.request_ids:
            self_tables[rid] = list(out.block_tables[rid])
            if out.is_prefill:
                cross_tables[rid] = list(out.cross_block_tables[rid])
        done.update({r.request_id: r.token_ids for r in out.finished})
    arena = llm.arena
    doubled = {}
    for a in [a for a in llm.attention_layers.values() if a.kind == "cross"]:
        name = a.pool
        start, addressed = arena.offsets[name], a.impl.layout
        doubled[name] = [(start + addressed.row_offset(b, 0, 0, 0), start + addressed.row_offset(b + 1, 0, 0, 0), r)
                         for r, rid in enumerate(ids) for b in cross_tables[rid]]
    self_blocks = []
    for name in [a.pool for a in llm.attention_layers.values() if a.kind == "self" and a.kv_sharing_target is None]:
        start, layout = arena.offsets[name], arena.layout(name)
        self_blocks += [(start + layout.row_offset(b, 0, 0, 0), start + layout.row_offset(b + 1, 0, 0, 0), r)
                        for r, rid in enumerate(ids) for b in self_tables[rid]]
    wrong = [i for i, rid in enumerate(ids) if done[rid] != reference[i]]
    return {"title": f"{factor:g}x: {blocks} blocks per cross pool ({need} needed)", "regions": arena.byte_map(),
            "doubled": doubled, "self_blocks": self_blocks, "wrong": wrong,
            "cross_tables": [cross_tables[rid] for rid in ids]}


def fp8_row_read(llm, pool: str, slot: int = 0, head: int = 0, kv: int = 0):
    """One row of an FP8 pool, and what the historical 16-bit context read makes of it.

    Returns (bytes, fp8_values, read_values): the 2 x head_size bytes the 16-bit reader fetches for (slot, head)
    in half `kv` (K: 0, V: 1), the FP8 row's head_size elements decoded as e4m3, and the head_size 16-bit
    elements the reader decodes from those bytes (in the model's dtype)."""
    from minikv.attention.cross import sixteen_bit_read_of
    from minikv.kernels.addressing import row_byte_offsets
    layout = llm.arena.layout(pool)
    if layout.kv_cache_dtype != "fp8":
        raise ValueError(f"pool {pool!r} holds {layout.kv_cache_dtype}, not fp8: build the engine with "
                         "kv_cache_dtype='fp8'")
    flat = llm.arena.pool(pool).view(-1)
    start = layout.row_offset(slot // layout.block_size, kv, slot % layout.block_size, head)
    fp8_values = flat[start:start + layout.head_size].clone().view(torch.float8_e4m3fn).float()
    read = sixteen_bit_read_of(layout)
    read_start = int(row_byte_offsets(read, torch.tensor([slot]), kv)[0, head])
    raw = flat[read_start:read_start + 2 * layout.head_size].clone()
    return raw, fp8_values, raw.view(layout.model_dtype).float()


ARENAS = {"one": "every pool in one allocation (minikv's KVArena)",
          "per-pool": "an allocation per pool (SeparateKVArena; TensorRT-LLM's pool manager)"}


def arena_runs(prompts, reference, need: int, factor: float = 1.5, device="cpu", backend="torch",
               model: str = MODEL) -> list[tuple[str, PoolRun]]:
    """The historical stride on a pool of `factor` x the blocks needed, in each arena shape, sanitizer on and off:
    [(arena, run)]. In one arena the overrun runs through the guard into the next pool (caught, or silently wrong
    tokens); with an allocation per pool there is no neighbour inside the allocation: on CPU the pool's own guard
    takes the overrun (caught, or harmless), on a GPU the access leaves the allocation, for compute-sanitizer to
    report (tools/memcheck_cross_stride.py)."""
    return [(arena, run_pool(prompts, reference, factor, need, True, sanitize, device, backend, model,
                             kv_arena=arena)) for arena in ARENAS for sanitize in (True, False)]


def arena_rows(runs: list[tuple[str, PoolRun]], n: int) -> list[list]:
    return [[arena, "on" if r.sanitize else "off", r.blocks,
             r.outcome + (f" ({_of(r.wrong, n)})" if r.outcome == "wrong tokens" else "")] for arena, r in runs]


ARENA_COLUMNS = ["arena", "sanitizer", "cross pool blocks", "historical stride"]


def format_arena_runs(runs: list[tuple[str, PoolRun]], n: int) -> str:
    table = [ARENA_COLUMNS] + arena_rows(runs, n)
    widths = [max(len(str(r[i])) for r in table) for i in range(len(ARENA_COLUMNS))]
    lines = ["  ".join(f"{c!s:{w}}" for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def check_arena_runs(runs: list[tuple[str, PoolRun]]) -> list[str]:
    """One arena: caught with the sanitizer on, wrong tokens without it; per pool (CPU, guarded): caught, and
    harmless without the sanitizer (the overrun stays in the pool's own guard)."""
    problems = []
    for arena, r in runs:
        want = "overrun caught" if r.sanitize else ("wrong tokens" if arena == "one" else "correct, guard hit")
        if r.outcome != want:
            problems.append(f"{arena} arena, sanitizer {'on' if r.sanitize else 'off'}: {r.outcome}, expected {want}")
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
    """The portable text of a relative error: the band it supports when small ('< 1e-3': 16-bit rounding,
    '< 0.1': FP8 rounding), else two significant digits ('x1.5' style values differ in their last bits from one
    CPU to another; the bands and two digits do not, for the errors this repro produces)."""
    for bound in (1e-3, 0.1):
        if err < bound:
            return f"< {bound:g}"
    if err < 0.5:
        return f"{err:.1f}"
    return "inf" if math.isinf(err) else f"{float(f'{err:.2g}'):g}"


def factor_key(factor: float) -> str:
    """1.5 -> '1_5x': the pool factor as it appears in quantity names (no '.', which separates results names)."""
    return f"{factor:g}".replace(".", "_") + "x"


def _of(wrong: list[int], n: int) -> str:
    return f"{len(wrong)} of {n}"


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
    pool_runs = [run_pool(prompts, auto if b else fixed_fp8, f, need, b, s, device, backend, model)
                 for f, b, s in tqdm(cases, desc="cross-pool sizes", disable=not progress)]
    bind_error = bind_time_check(device, model)
    ctx_runs = [run_context(prompts, fixed_fp8, v, device, backend, model)
                for v in tqdm(VERSIONS, desc="context paths", disable=not progress)]
    copies = identical_requests(make_prompts(1, seed=2, model=model)[0], device, backend, model)
    overruns = {f: overrun_facts(f, need, device, model) for f in (1.0, 1.5, 2.0)}
    # The per-pool arena allocates each pool exactly on a GPU, where the historical overrun then leaves the
    # allocation: that case runs only under compute-sanitizer, in its own process (tools/memcheck_cross_stride.py).
    arenas = arena_runs(prompts, auto, need, 1.5, device, backend, model) if torch.device(device).type == "cpu" \
        else []
    return Measurement(prompts, need, pool_runs, bind_error, ctx_runs, copies, overruns, str(device), backend,
                       str(model), reference_kind, arenas)


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
            "value": len(r.wrong), "display": _of(r.wrong, n),
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
        "value": len(hist.wrong), "display": _of(hist.wrong, n),
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
            r.outcome + (f" ({_of(r.wrong, n)})" if r.outcome == "wrong tokens" else "") for r in row])
    b2 = {"caption": "B2: cross-attention output vs exact float32 attention over the K/V the path is meant to "
                     "read (the FP8 cache's contents; the 16-bit K/V for the unfused path), max |out - exact| / "
                     "max |exact| over requests and cross layers",
          "columns": ["version", "context path", "context step", "decode steps", "wrong requests"],
          "rows": [[r.version, r.path, error_display(r.context_error), error_display(r.decode_error),
                    _of(r.wrong, n)] for r in m.ctx_runs]}
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
                       "fidelity/ for compute-sanitizer's report)",
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


def main(argv: list[str] | None = None) -> int:
    from minikv.argtypes import UsageParser, positive_int
    p = UsageParser(prog="minikv repro cross-stride", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL,
                   help=f"{MODEL} (the default) or the path of a T5 checkpoint directory (config.json, "
                        "safetensors, tokenizer)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default=None, choices=("triton", "torch"),
                   help="kernel backend (default: triton on cuda; torch on cpu, where the Triton interpreter would "
                        "take many minutes: the defect lives in the engine's Python, which both backends run)")
    p.add_argument("--requests", type=positive_int, default=6, help="requests served at once (default 6)")
    p.add_argument("--results", default=None, metavar="PATH",
                   help="also write the measured quantities and tables as JSON (e.g. results/cross_stride.json)")
    args = p.parse_args(argv)
    args.backend = args.backend or ("triton" if args.device.startswith("cuda") else "torch")

    start = time.perf_counter()
    m = measure(args.requests, args.device, args.backend, progress=True, model=args.model)
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
