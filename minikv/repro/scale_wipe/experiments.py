"""The side experiments of defect A, each with its table and its check: arrival timing through the step API,
the census per warmup shape (minikv's reading of upstream's "(pre-write)"), prefix caching by the order of the
copies and the prompts' length, the cached blocks each request finds, and sleep / wake-up. See
docs/internals.md#repro-scale-wipe-experiments."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from minikv.repro.common import ranges

from .run import (
    MODEL,
    Run,
    attention_damage,
    compare,
    damaged_against,
    default_ignore_eos,
    engine_blocks,
    judge_of,
    run_engine,
    task_of,
)


@dataclass
class ArrivalRun:
    seed: int
    arrivals: list[int]            # how many requests arrived before each step
    first_batch: list[int]         # the requests the first step ran (indices into the prompts)
    damaged: list[int]


def _arrivals(prompts, max_num_seqs: int, seed: int, buggy: bool, device, backend, max_tokens, model):
    """Drive one engine while requests arrive over several steps; (token ids, texts, arrivals, first batch)."""
    import random

    import minikv
    rng = random.Random(seed)
    llm = minikv.LLM(model=model, kv_cache_dtype="int8_per_token_head", max_num_seqs=max_num_seqs,
                     device=device, backend=backend, reintroduce=("scale-wipe",) if buggy else (),
                     num_blocks=engine_blocks(model, prompts, max_num_seqs, max_tokens))
    params = minikv.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=default_ignore_eos(model))
    pending, index_of, done, arrivals, first = list(range(len(prompts))), {}, {}, [], None
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
        done.update({index_of[r.request_id]: r for r in out.finished})
    outs = [done[i] for i in range(len(prompts))]
    return [o.token_ids for o in outs], [o.text for o in outs], arrivals, first


def arrival_run(prompts, max_num_seqs: int, seed: int, device="cpu", backend="torch",
                max_tokens: int = 12, *, model: str = MODEL) -> ArrivalRun:
    """The buggy engine driven step by step while requests arrive over several steps."""
    ids, texts, arrivals, first = _arrivals(prompts, max_num_seqs, seed, True, device, backend, max_tokens, model)
    task = task_of(model)
    if judge_of(model) == "task":
        damaged = [i for i in range(len(prompts)) if not task.check(prompts[i], texts[i])]
    else:
        fixed_ids = _arrivals(prompts, max_num_seqs, seed, False, device, backend, max_tokens, model)[0]
        damaged = damaged_against(ids, fixed_ids, [False] * len(ids), "fixed run")
    return ArrivalRun(seed, arrivals, first, damaged)


# ---- minikv's reading of upstream's "(pre-write)" tag -----------------------------------------------------------
# Upstream's census says its 33 harmless fills happened "(pre-write)". minikv sorts each fill by when it happened
# relative to the first write into its storage: warmup fills come before any write (nothing is written at warmup);
# a KV-sharing layer's fill at step 0 comes after its owner wrote the step's tokens there (the owner runs first).
# The first sharer of each storage wipes those scales; every later sharer finds only the 1.0s that wipe left, so it
# overwrites nothing: harmless, but after a write. A census that sorts fills by what they overwrote cannot tell
# those from fills before any write. The cases below show which warmup would make the tag literally true.
WARMUP_CASES = {
    "dummy": "upstream's shape (minikv's default): no attention metadata; owners fill, sharers are not run",
    "capture": "CUDA-graph capture: one forward with attention metadata through every layer",
    "later sharers": "hand-picked: the dummy warmup plus every sharer except the first of each storage touched "
                     "before the first step (no engine's warmup has this shape)",
}


@dataclass
class WarmupCensus:
    case: str
    pre_write: list[int]            # layers whose fill came before the first write to its storage
    post_write_harmless: list[int]  # layers whose fill came after that write and overwrote nothing
    wiping: list[int]               # layers whose fill overwrote written scales
    damaged: list[int]


def later_sharers(run: Run) -> tuple[int, ...]:
    """Every KV-sharing layer except the first sharer of each storage."""
    first = {min(layer for layer, s in run.sharing.items() if s == owner) for owner in set(run.sharing.values())}
    return tuple(sorted(set(run.sharing) - first))


def warmup_census(prompts, max_num_seqs: int = 4, device="cpu", backend="torch", *, model: str = MODEL,
                  max_tokens: int = 12, damage: str = "tokens", runs: tuple[Run, Run] | None = None
                  ) -> list[WarmupCensus]:
    """The buggy engine's census and damage under each of `WARMUP_CASES`."""
    capture = damage == "attention"
    fixed = runs[0] if runs else run_engine("int8_per_token_head", max_num_seqs, False, False, prompts, device,
                                            backend, max_tokens, model=model, capture_attention=capture)
    out = []
    for case in WARMUP_CASES:
        kw = {"warmup": "capture"} if case == "capture" else {}
        if case == "later sharers":
            kw["touch_before_start"] = later_sharers(fixed)
        if runs and case == "dummy":
            buggy = runs[1]
        else:
            buggy = run_engine("int8_per_token_head", max_num_seqs, False, True, prompts, device, backend,
                               max_tokens, model=model, capture_attention=capture, **kw)
        compare(fixed, buggy)
        if capture:
            buggy.damaged = attention_damage(fixed, buggy)
        out.append(WarmupCensus(case, [f.layer for f in buggy.fills if f.step < 0 and not f.overwritten],
                                [f.layer for f in buggy.fills if f.step >= 0 and not f.overwritten],
                                [f.layer for f in buggy.fills if f.overwritten], buggy.damaged))
    return out


WARMUP_COLUMNS = ["warmup", "fills before the first write", "later fills, nothing left to wipe",
                  "fills that wiped (layers)", "damaged requests"]


def warmup_census_rows(rows: list[WarmupCensus]) -> list[list]:
    return [[r.case, len(r.pre_write), len(r.post_write_harmless),
             f"{len(r.wiping)} ({', '.join(map(str, r.wiping)) or '-'})", ranges(r.damaged)] for r in rows]


def format_warmup_census(rows: list[WarmupCensus], model: str = MODEL) -> str:
    table = [WARMUP_COLUMNS] + warmup_census_rows(rows)
    widths = [max(len(str(r[i])) for r in table) for i in range(len(WARMUP_COLUMNS))]
    lines = ["  ".join(f"{c!s:{w}s}" for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "-" * len(lines[0]))
    lines += [f"  {case}: {why}" for case, why in WARMUP_CASES.items()]
    return "\n".join(lines)


def check_warmup_census(rows: list[WarmupCensus], max_num_seqs: int) -> list[str]:
    """dummy: the same 2 wipe after the owners' pre-write fills; capture: nothing wipes; later sharers: every
    harmless fill before the first write and still the same 2 wiping fills and the same damage."""
    by = {r.case: r for r in rows}
    problems = []
    dummy, capture, picked = by["dummy"], by["capture"], by["later sharers"]
    if len(dummy.wiping) != 2 or dummy.damaged != list(range(max_num_seqs)):
        problems.append(f"dummy warmup: wiping fills {dummy.wiping}, damaged {ranges(dummy.damaged)}")
    if capture.wiping or capture.damaged or capture.post_write_harmless:
        problems.append(f"capture warmup: wiping {capture.wiping}, late harmless {capture.post_write_harmless}, "
                        f"damaged {ranges(capture.damaged)}")
    if picked.wiping != dummy.wiping or picked.post_write_harmless or picked.damaged != dummy.damaged or \
            len(picked.pre_write) != len(dummy.pre_write) + len(dummy.post_write_harmless):
        problems.append(f"later-sharers warmup: pre-write {len(picked.pre_write)}, late harmless "
                        f"{picked.post_write_harmless}, wiping {picked.wiping}, damaged {ranges(picked.damaged)}")
    return problems


# ---- prefix caching and the order of the copies ------------------------------------------------------------------
PREFIX_ORDERS = {"after": "copies after the distinct prompts (p0 .. pN, p0 .. pN, ...)",
                 "adjacent": "copies next to each other (p0, p0, p0, p0, p1, ...)"}
PREFIX_PROMPTS = {"no full block": 12, "full blocks": 40}     # prompt tokens with BOS; blocks hold 16


@dataclass
class PrefixRun:
    order: str
    prompt_set: str
    max_num_seqs: int
    damaged: list[int]

    @property
    def first_batch_only(self) -> bool:
        return self.damaged == list(range(self.max_num_seqs))


def prefix_prompts(order: str, prompt_set: str, distinct: int = 6, copies: int = 4, model: str = MODEL,
                   seed: int = 0) -> list[str]:
    """`distinct` prompts of `PREFIX_PROMPTS[prompt_set]` tokens (BOS included), `copies` of each, in `order`."""
    base = task_of(model).prompts(distinct, seed=seed, num_tokens=PREFIX_PROMPTS[prompt_set])
    if order == "after":
        return base * copies
    return [p for p in base for _ in range(copies)]


def prefix_caching_runs(max_num_seqs=(4, 6, 8), device="cpu", backend="torch", *, model: str = MODEL,
                        max_tokens: int = 4, distinct: int = 6, copies: int = 4) -> list[PrefixRun]:
    """The buggy engine with prefix caching on, int8_per_token_head, for each order x prompt set x
    max_num_seqs: which requests come out damaged (against a fixed engine with the same settings)."""
    out, checked = [], {}
    by_task = judge_of(model) == "task"
    capture = judge_of(model) == "fixed run"
    for order, prompt_set, seqs in itertools.product(PREFIX_ORDERS, PREFIX_PROMPTS, max_num_seqs):
        prompts = prefix_prompts(order, prompt_set, distinct, copies, model)
        # A model judged by its task needs one fixed run per prompt set, to show the fix answers every copy right
        # (then a wrong buggy answer differs from the fixed one); otherwise each buggy run gets its own fixed run.
        fixed = checked.get(prompt_set) if by_task else None
        if fixed is None:
            fixed = run_engine("int8_per_token_head", seqs, True, False, prompts, device, backend, max_tokens,
                               model=model, capture_attention=capture)
            checked[prompt_set] = fixed
        buggy = run_engine("int8_per_token_head", seqs, True, True, prompts, device, backend, max_tokens,
                           model=model, capture_attention=capture)
        if by_task:
            buggy.damaged = [i for i, ok in enumerate(buggy.right) if not ok]
            fixed.damaged = [i for i, ok in enumerate(fixed.right) if not ok]
        else:
            compare(fixed, buggy)
            if capture:
                buggy.damaged = attention_damage(fixed, buggy)
        if fixed.damaged:
            raise AssertionError(f"fixed engine damaged {ranges(fixed.damaged)} ({order}, {prompt_set}, {seqs})")
        out.append(PrefixRun(order, prompt_set, seqs, buggy.damaged))
    return out


PREFIX_COLUMNS = ["copies", "prompts", "max_num_seqs", "damaged (buggy, prefix caching on)", "exactly the first batch"]


def prefix_rows(runs: list[PrefixRun]) -> list[list]:
    return [[r.order, f"{r.prompt_set} ({PREFIX_PROMPTS[r.prompt_set]} tokens)", r.max_num_seqs, ranges(r.damaged),
             "yes" if r.first_batch_only else "no"] for r in runs]


def format_prefix_runs(runs: list[PrefixRun]) -> str:
    table = [PREFIX_COLUMNS] + prefix_rows(runs)
    widths = [max(len(str(r[i])) for r in table) for i in range(len(PREFIX_COLUMNS))]
    lines = ["  ".join(f"{c!s:{w}s}" for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def check_prefix_runs(runs: list[PrefixRun], copies: int = 4) -> list[str]:
    """Check which requests the prefix-caching runs damaged."""
    problems = []
    for r in runs:
        expect = r.prompt_set == "no full block" or (r.order == "adjacent" and r.max_num_seqs % copies == 0)
        if r.first_batch_only != expect or not set(range(r.max_num_seqs)) <= set(r.damaged):
            problems.append(f"prefix caching, {r.order}, {r.prompt_set}, max_num_seqs={r.max_num_seqs}: damaged "
                            f"{ranges(r.damaged)}")
    return problems


@dataclass
class Reuse:
    """One request of a buggy run with prefix caching on, as the engine served it (`prefix_reuse`)."""

    request: int
    copy_of: int | None            # the earlier request with the same prompt, if any
    step: int                      # the step that ran its prefill
    full_blocks: int               # full blocks its prompt fills (only those can be found in the prefix cache)
    found: int                     # blocks it found in the prefix cache
    found_wiped: int               # of those, blocks written at step 0 (their scales wiped) and not written since
    evictions: int                 # cached-free blocks the block manager had evicted before its prefill
    damaged: bool                  # measured: wrong by the task and different from the fixed engine's answer


@dataclass
class PrefixReuse:
    max_num_seqs: int
    num_blocks: int
    requests: list[Reuse]

    @property
    def damaged(self) -> list[int]:
        return [r.request for r in self.requests if r.damaged]

    @property
    def predicted(self) -> list[int]:
        """The rule: damaged when in the first step's batch, or when it found a wiped block in the prefix cache."""
        return [r.request for r in self.requests if r.step == 0 or r.found_wiped]


def prefix_reuse(prompts, max_num_seqs: int, device="cpu", backend="torch", max_tokens: int = 12,
                 model: str = MODEL) -> PrefixReuse:
    """Serve `prompts` on a buggy engine with prefix caching on (and a fixed one, to judge), recording from the
    step outputs and the block manager, for every request, what it found in the prefix cache and whether that was
    a block the first step wrote (and the wipe reset) that nobody has written since."""
    import minikv
    task = task_of(model)
    texts, seen = {}, {}
    for buggy in (False, True):
        llm = minikv.LLM(model=model, kv_cache_dtype="int8_per_token_head", max_num_seqs=max_num_seqs,
                         enable_prefix_caching=True, device=device, backend=backend,
                         reintroduce=("scale-wipe",) if buggy else (),
                         num_blocks=engine_blocks(model, prompts, max_num_seqs, max_tokens))
        manager, bs = llm.scheduler.block_manager, llm.config.cache.block_size
        params = minikv.SamplingParams(max_tokens=max_tokens, ignore_eos=default_ignore_eos(model))
        ids = [llm.add_request(p, params) for p in prompts]
        done, wiped, tables = {}, set(), {}
        while llm.has_unfinished():
            evictions = manager.num_evictions
            out = llm.step()
            for rid in out.request_ids:
                table = list(out.block_tables[rid])
                if out.is_prefill:
                    found = out.num_cached_tokens.get(rid, 0) // bs
                    seen[rid] = (out.step, found, len(set(table[:found]) & wiped), evictions)
                    fresh = table[found:]
                else:
                    fresh = [b for b in table if b not in tables[rid]]
                if out.step == 0:
                    wiped.update(table[:len(out.slot_mapping[rid]) // bs])    # its full prompt blocks
                else:
                    wiped.difference_update(fresh)                            # written again since
                tables[rid] = table
            done.update({o.request_id: o.text for o in out.finished})
        texts[buggy] = [done[i] for i in ids]
    tokens = [len(llm.tokenizer.encode(p)) for p in prompts]
    rows = []
    for i, rid in enumerate(ids):
        step, found, found_wiped, evictions = seen[rid]
        damaged = texts[True][i] != texts[False][i] and not task.check(prompts[i], texts[True][i])
        rows.append(Reuse(i, prompts.index(prompts[i]) if prompts.index(prompts[i]) != i else None, step,
                          tokens[i] // bs, found, found_wiped, evictions, damaged))
    return PrefixReuse(max_num_seqs, manager.num_blocks, rows)


def format_prefix_reuse(run: PrefixReuse, requests=None) -> str:
    """One line per request (default: every copy of an earlier request)."""
    rows = [r for r in run.requests if (r.copy_of is not None if requests is None else r.request in requests)]
    lines = [f"max_num_seqs={run.max_num_seqs}, a pool of {run.num_blocks} blocks; damaged: {ranges(run.damaged)}",
             f"{'req':>4s} {'copy of':>7s} {'prefill at step':>15s} {'full blocks':>11s} {'found cached':>12s} "
             f"{'of them wiped':>13s} {'evictions so far':>16s}  damaged"]
    for r in rows:
        lines.append(f"{r.request:4d} {'-' if r.copy_of is None else r.copy_of:>7} {r.step:15d} {r.full_blocks:11d} "
                     f"{r.found:12d} {r.found_wiped:13d} {r.evictions:16d}  {'DAMAGED' if r.damaged else ''}")
    return "\n".join(lines)


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
                   reinit: bool = True, device="cpu", backend="torch", model: str = MODEL, max_tokens: int = 12,
                   reference: list[list[int]] | None = None) -> WakeRun:
    """Serve `prompts`, sleep, wake up, serve them again; damaged after the wake: wrong by the task's check, or
    (a model judged by the fixed run) token ids other than `reference`, a fixed engine's first serving."""
    import minikv
    task = task_of(model)
    llm = minikv.LLM(model=model, kv_cache_dtype="int8_per_token_head", max_num_seqs=max_num_seqs,
                     device=device, backend=backend, reintroduce=("scale-wipe",) if buggy else (),
                     repro=minikv.ReproConfig(reinit_scales_on_wake=reinit), num_blocks=engine_blocks(model, prompts, max_num_seqs, max_tokens))
    params = minikv.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=default_ignore_eos(model))
    llm.generate(prompts, params, use_tqdm=False)
    storage, fills = llm.arena.storage.untyped_storage(), len(llm.census.fills)
    address = storage.data_ptr()
    llm.sleep(mode=mode)
    llm.wake_up()
    stale = 0
    for a in llm.attention_layers.values():
        if a.kv_sharing_target is None:
            k, v = a.layout.scale_views(a.kv_cache)
            stale += int((k != 1).sum() + (v != 1).sum())
    outs = llm.generate(prompts, params, use_tqdm=False)
    now = llm.arena.storage.untyped_storage()
    if reference is None:
        damaged = [i for i, (p, o) in enumerate(zip(prompts, outs)) if not task.check(p, o.text)]
    else:
        damaged = [i for i, (o, r) in enumerate(zip(outs, reference)) if o.token_ids != r]
    return WakeRun(label, mode, now is storage and now.data_ptr() == address, len(llm.census.fills) - fills, stale,
                   damaged)


def wake_runs(prompts, max_num_seqs: int, device="cpu", backend="torch", *, model: str = MODEL,
              max_tokens: int = 12) -> list[WakeRun]:
    reference = None
    if judge_of(model) != "task":
        reference = run_engine("int8_per_token_head", max_num_seqs, False, False, prompts, device, backend,
                               max_tokens, model=model).token_ids
    kw = {"device": device, "backend": backend, "model": model, "max_tokens": max_tokens, "reference": reference}
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
