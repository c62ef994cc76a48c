"""`minikv repro scale-wipe`: defect A, buggy and fixed, over max_num_seqs x prefix caching x cache format.

`--model` picks what runs: tiny-gemma4 (the default: trained, 8 layers, two sharers per shared storage),
tiny-gemma4-e2b (gemma-4-E2B's 35-layer topology with random weights: upstream's census, 33 harmless fills and 2
that wipe), or a checkpoint directory in transformers' format (a Gemma-4 text model with its own tokenizer, e.g.
gemma-4-E2B-it; prompts from `minikv.tasks.for_checkpoint`, which adapts them to the tokenizer).

For every configuration a fixed engine and a buggy engine (`reintroduce=("scale-wipe",)`) serve the same
requests. A request is *damaged* when the buggy engine's answer is wrong by the task's check and differs from
the fixed engine's; for a model whose answers cannot be judged right (random weights, or a checkpoint directory
whose fixed engine does not answer every prompt right) it is damaged when its token ids differ from the fixed
engine's (`Run.judge`: "task" or "fixed run"). After the first forward step, the K/V of the first batch's prompt are read back from the
KV-sharing targets' pools of both engines: the ratio of their magnitudes is the measured inflation, compared
with 1 / (the true scale the fixed engine stored).

Upstream signatures checked (exit status 0 only if all hold): the buggy engine damages exactly the first
max_num_seqs requests with prefix caching off (at least those with it on; carrying the damage to later requests
through the prefix cache is minikv's own observation, upstream called the prefix-caching correlation spurious),
later batches stay clean, the fills that wipe written scales are late fills of KV-sharing layers, the inflation
equals 1 / true scale, a 16-bit cache is untouched by the switch, and every fixed run has zero damaged requests.

Then smaller tables:
* the census per warmup shape, minikv's reading of upstream's "(pre-write)" tag: which fills come before the
  first write to their storage, which come after it and find nothing left to wipe, which wipe;
* prefix caching and request order: which order of the copies and which prompt lengths give "exactly the first
  batch" (upstream's report) and which carry the damage to copies that reuse wiped blocks;
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
import json
import re
import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from minikv.kernels.formats import PER_TOKEN_HEAD_KV_CACHE_DTYPES
from minikv.repro.common import dequantized_rows, ranges, stored_scales

MODEL = "tiny-gemma4"     # Gemma-4 topology: layers 4 and 6 read layer 2's cache, 5 and 7 read layer 3's
E2B_MODEL = "tiny-gemma4-e2b"   # gemma-4-E2B's: layers 15-34 read layer 13's (sliding) or 14's (full) cache
FORMATS = PER_TOKEN_HEAD_KV_CACHE_DTYPES                # int8 and fp8 per-token-head: the formats with inline scales
NOTEBOOK = "notebooks/03_kv_sharing_scale_wipe.ipynb"    # walks through the same measurement, printing the same figures


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
    fills: list[Fill] = field(default_factory=list)       # the engine's census, in the order the fills happened
    sharing: dict[int, int] = field(default_factory=dict)  # KV-sharing layer -> the layer whose storage it reads
    layer_types: tuple[str, ...] = ()                      # "sliding" / "full" per layer
    model: str = MODEL
    judge: str = "task"        # damaged = "task": wrong and differs from the fixed run; "fixed run": differs;
                               # "auto" (checkpoint directories): "task" if the fixed run answers all right
    token_ids: list[list[int]] = field(default_factory=list)
    # with `capture_attention`: per request, its prefill step's attention outputs in every KV-sharing layer
    sharer_outputs: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class Fill:
    """One fill of a storage's scale regions with 1.0, as the census logged it, by layer index."""

    layer: int
    storage: int          # the layer that owns the storage (a KV-sharing layer fills its target's)
    step: int             # -1: during warmup
    overwritten: int      # written scales it replaced with 1.0


def layer_index(name: str) -> int:
    """'model.layers.4.self_attn' -> 4."""
    match = re.search(r"layers\.(\d+)\.", name)
    if match is None:
        raise ValueError(f"not a decoder layer name: {name!r}")
    return int(match.group(1))


def census_fills(llm) -> list[Fill]:
    """The engine's scale-fill census as `Fill`s (layer indices; the storage named by its owning layer)."""
    owner = {n: a.kv_sharing_target or n for n, a in llm.attention_layers.items()}
    return [Fill(layer_index(f.layer), layer_index(owner[f.layer]), f.step, f.overwritten)
            for f in llm.census.fills]


def task_of(model: str = MODEL):
    """The prompts and the right/wrong check for `model`: its own task for a shipped model; for a checkpoint
    directory, the task `minikv.tasks.for_checkpoint` fits to its tokenizer."""
    import minikv
    from minikv.models import registry
    if registry.is_checkpoint_model(model):
        return minikv.tasks.for_model(model)
    return minikv.tasks.for_checkpoint(registry.get_tokenizer(model), model=str(model))


def judge_of(model: str = MODEL) -> str:
    """How a damaged request is recognized on `model` (`Run.judge`)."""
    from minikv.models import registry
    if registry.is_checkpoint_model(model):
        return "fixed run" if model in registry.RANDOM_WEIGHT_MODELS else "task"
    return "auto"


def default_ignore_eos(model: str = MODEL) -> bool:
    """A random-weight model may end any answer at once: its runs generate every token (ignore EOS)."""
    from minikv.models import registry
    return model in registry.RANDOM_WEIGHT_MODELS


def engine_blocks(model: str, prompts: list[str], max_num_seqs: int, max_tokens: int) -> int | None:
    """KV blocks for a checkpoint directory's runs: enough for every request at once (a real checkpoint's
    context length, gemma-4-E2B's 131,072, would otherwise size each pool for max_num_seqs full-length
    requests: gigabytes). None for a shipped model: its default, so its figures stay as recorded."""
    from minikv.models import registry
    if registry.is_checkpoint_model(model):
        return None
    longest = max(len(registry.get_tokenizer(model).encode(p)) for p in prompts) + 1 + max_tokens
    return (len(prompts) + max_num_seqs) * -(-longest // 16)


def make_prompts(num_requests: int, copies: int = 2, seed: int = 0, model: str = MODEL) -> list[str]:
    """Upstream's shape in small: distinct prompts, then the same list again (copies of each)."""
    distinct = task_of(model).prompts(max(1, num_requests // copies), seed=seed)
    return list(itertools.islice(itertools.cycle(distinct), num_requests))


def run_engine(kv_cache_dtype: str, max_num_seqs: int, prefix_caching: bool, buggy: bool, prompts: list[str],
               device: str = "cpu", backend: str = "triton", max_tokens: int = 12, *, model: str = MODEL,
               ignore_eos: bool | None = None, warmup: str = "dummy", touch_before_start: tuple[int, ...] = (),
               capture_attention: bool = False) -> Run:
    """Serve `prompts` on one engine and record its census, answers and (per-token-head formats) the first
    batch's K/V in the shared storages right after step 0. `touch_before_start`: layers whose attention impl is
    touched (builds its scale views) after the warmup and before the first step, as a warmup that ran exactly
    those layers would have (the "(pre-write)" experiment, `warmup_census`). `capture_attention`: keep each
    request's prefill-step attention outputs in the KV-sharing layers (`Run.sharer_outputs`, `attention_damage`)."""
    import minikv
    task = task_of(model)
    ignore_eos = default_ignore_eos(model) if ignore_eos is None else ignore_eos
    llm = minikv.LLM(model=model, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                     enable_prefix_caching=prefix_caching, device=device, backend=backend,
                     reintroduce=("scale-wipe",) if buggy else (), warmup=warmup,
                     num_blocks=engine_blocks(model, prompts, max_num_seqs, max_tokens))
    for name, a in llm.attention_layers.items():
        if layer_index(name) in touch_before_start:
            a.impl.scale_views(a.kv_cache)
    layout = llm.kv_layout
    captured: dict = {}
    params = minikv.SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos)
    ids = [llm.add_request(p, params) for p in prompts]
    results, outputs = {}, {}
    sharers = {n for n, a in llm.attention_layers.items() if a.kv_sharing_target is not None}
    while llm.has_unfinished():
        out = llm.step(capture=capture_attention)
        if capture_attention and out.is_prefill:
            lens = [len(out.slot_mapping[rid]) for rid in out.request_ids]
            per_layer = [e.tensors["out"].split(lens) for e in out.trace.events if e.layer in sharers]
            for i, rid in enumerate(out.request_ids):
                outputs[rid] = torch.cat([chunks[i].flatten() for chunks in per_layer])
        if out.step == 0 and layout.has_inline_scales:
            # Right after the very first forward step: read the first batch's rows back from the pools the
            # KV-sharing layers read (their targets' pools).
            sharing = {e.pool for e in out.trace.events if e.read and not e.wrote and e.kind == "self"}
            slots = [s for rid in out.request_ids for s in out.block_slots(rid, layout.block_size)]
            for name in sorted(sharing):
                pool = llm.arena.pool(name)
                k, v = dequantized_rows(llm.arena.layout(name), pool, slots)
                ks, vs = stored_scales(llm.arena.layout(name), pool, slots)
                captured[name] = (k, v, ks, vs)
        results.update({r.request_id: r for r in out.finished})
    outs = [results[i] for i in ids]
    texts = [o.text for o in outs]
    census = llm.census
    return Run(kv_cache_dtype, max_num_seqs, prefix_caching, buggy, texts,
               [task.check(p, t) for p, t in zip(prompts, texts)], len(census.harmless),
               [(f.layer, f.overwritten) for f in census.wiping], captured, fills=census_fills(llm),
               sharing=dict(llm.model_config.kv_sharing), layer_types=layer_types(llm), model=str(model),
               judge=judge_of(model), token_ids=[o.token_ids for o in outs],
               sharer_outputs=[outputs[i] for i in ids] if capture_attention else [])


def layer_types(llm) -> tuple[str, ...]:
    """("sliding", "full", ...) per decoder layer."""
    return tuple(t.split("_")[0] for t in getattr(llm.model_config, "layer_types", ()))


def damaged_against(ids: list[list[int]], fixed_ids: list[list[int]], right: list[bool], judge: str) -> list[int]:
    """Requests whose token ids differ from the fixed run's and, when judged by the task, are wrong."""
    return [i for i, (a, b, ok) in enumerate(zip(ids, fixed_ids, right)) if a != b and (judge != "task" or not ok)]


def attention_damage(fixed: Run, buggy: Run) -> list[int]:
    """Requests whose prefill-step attention outputs in the KV-sharing layers differ from the fixed engine's (both
    runs with `capture_attention`). A request whose batch read no wiped scale computes exactly what the fixed engine
    computes, bit for bit, so any difference is the wipe's; this shows the damage of a random-weight model after
    one step, where its tokens may take several steps to diverge."""
    return [i for i, (a, b) in enumerate(zip(buggy.sharer_outputs, fixed.sharer_outputs)) if not torch.equal(a, b)]


def compare(fixed: Run, buggy: Run) -> None:
    """Fill in the buggy run's damage and inflation, measured against the fixed run."""
    if buggy.judge == "auto":
        buggy.judge = fixed.judge = "task" if all(fixed.right) else "fixed run"
    buggy.damaged = damaged_against(buggy.token_ids or buggy.texts, fixed.token_ids or fixed.texts, buggy.right,
                                    buggy.judge)
    fixed.damaged = [i for i, ok in enumerate(fixed.right) if not ok] if fixed.judge == "task" else []
    ratios_k, ratios_v, errors = [], [], []
    for name, (kb, vb, _, _) in buggy.first_batch_kv.items():
        kf, vf, ksf, _ = fixed.first_batch_kv[name]
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


# Upstream's census on gemma-4-E2B-it (the description of vLLM pull request #51061, minikv/provenance.py): fills that
# wiped nothing, and the written scales each late wiping fill overwrote. It does not break the harmless fills down further.
UPSTREAM_CENSUS = {"harmless": 33, "wiping": 2, "wiped": (22_384, 13_394)}
UPSTREAM_INFLATION = {"K": 221, "V": 24}


@dataclass
class StorageCensus:
    """The fills one storage received: its owner's, then its sharers' in the order they touched it."""

    storage: int                 # the owning layer
    layer_type: str
    sharers: list[int]
    fills: list[Fill]

    @property
    def wiping(self) -> list[Fill]:
        return [f for f in self.fills if f.overwritten]

    @property
    def harmless(self) -> list[Fill]:
        return [f for f in self.fills if not f.overwritten]


def census_by_storage(run: Run) -> list[StorageCensus]:
    """Group a run's census by storage; shared storages first (in owner order), then the unshared ones."""
    owners = sorted({f.storage for f in run.fills} | set(run.sharing.values()))
    out = []
    for owner in owners:
        sharers = sorted(layer for layer, target in run.sharing.items() if target == owner)
        kind = run.layer_types[owner] if owner < len(run.layer_types) else "?"
        out.append(StorageCensus(owner, kind, sharers, [f for f in run.fills if f.storage == owner]))
    return sorted(out, key=lambda c: (not c.sharers, c.storage))


def census_counts(run: Run) -> dict[str, int]:
    """{"harmless": fills that wiped nothing, "warmup": of those, the warmup ones, "late_harmless": the late ones,
    "wiping": late fills that wiped written scales}."""
    warmup = sum(1 for f in run.fills if f.step < 0 and not f.overwritten)
    late_harmless = sum(1 for f in run.fills if f.step >= 0 and not f.overwritten)
    return {"harmless": warmup + late_harmless, "warmup": warmup, "late_harmless": late_harmless,
            "wiping": sum(1 for f in run.fills if f.overwritten)}


def _fill_text(fills: list[Fill]) -> str:
    """'layer 6 step 0: 0'; several fills at one step that overwrote the same count: 'layers 16-18, 20 step 0: 0
    each'."""
    if not fills:
        return "-"
    groups: dict[tuple[int, int], list[int]] = {}
    for f in fills:
        groups.setdefault((f.step, f.overwritten), []).append(f.layer)
    parts = []
    for (step, overwritten), layers in groups.items():
        when = "warmup" if step < 0 else f"step {step}"
        if len(layers) == 1:
            parts.append(f"layer {layers[0]} {when}: {overwritten:,}")
        else:
            parts.append(f"layers {ranges(layers)} {when}: {overwritten:,} each")
    return ", ".join(parts)


def census_rows(run: Run) -> list[list]:
    """[storage, layer type, sharers, owner's fill, the wiping late fill, harmless late fills] per storage."""
    rows = []
    for c in census_by_storage(run):
        own = [f for f in c.fills if f.layer == c.storage]
        late = [f for f in c.fills if f.layer != c.storage]
        rows.append([f"layer {c.storage}", c.layer_type, ", ".join(map(str, c.sharers)) or "-", _fill_text(own),
                     _fill_text([f for f in late if f.overwritten]), _fill_text([f for f in late if not f.overwritten])])
    return rows


CENSUS_COLUMNS = ["storage of", "type", "read by", "owner's fill", "late fill that wipes", "harmless late fills"]


def format_census(run: Run) -> str:
    """The census of one run per storage (fills as `layer, when: written scales overwritten`), then its totals next
    to upstream's."""
    rows = [CENSUS_COLUMNS] + census_rows(run)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(CENSUS_COLUMNS))]
    lines = ["  ".join(f"{c!s:{w}s}" for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    n = census_counts(run)
    wiped = " and ".join(f"{f.overwritten:,}" for f in run.fills if f.overwritten)
    up = UPSTREAM_CENSUS
    ours = f"{n['wiping']} late fills wiped {wiped} written scales" if wiped else "no fill wiped a written scale"
    lines += ["",
              (f"minikv   ({run.model}): {n['harmless']} fills wiped nothing ({n['warmup']} warmup fills of the owning "
               f"layers + {n['late_harmless']} late fills of later sharers); {ours}"),
              (f"upstream (gemma-4-E2B-it): {up['harmless']} fills wiped nothing; {up['wiping']} late fills wiped "
               f"{up['wiped'][0]:,} and {up['wiped'][1]:,} written scales")]
    return "\n".join(lines)


def check_census(run: Run) -> list[str]:
    """Upstream's census shape, per shared storage: the owner's fill at warmup wipes nothing; the first sharer to
    touch the storage (at step 0) wipes the scales written there; every later sharer's fill is a harmless late fill.
    A fixed engine: only the owners' warmup fills."""
    tag = f"{'buggy' if run.buggy else 'fixed'} {run.kv_cache_dtype} max_num_seqs={run.max_num_seqs}"
    problems = []
    for c in census_by_storage(run):
        own = [f for f in c.fills if f.layer == c.storage]
        if [(f.step, f.overwritten) for f in own] != [(-1, 0)]:
            problems.append(f"{tag}: storage of layer {c.storage}: owner's fills {own}, expected one at warmup")
        late = [f for f in c.fills if f.layer != c.storage]
        if not run.buggy:
            if late:
                problems.append(f"{tag}: storage of layer {c.storage}: late fills {late} in the fixed engine")
            continue
        if [f.layer for f in late] != c.sharers or any(f.step != 0 for f in late):
            problems.append(f"{tag}: storage of layer {c.storage}: late fills by {[f.layer for f in late]}, "
                            f"expected one per sharer {c.sharers} at step 0")
        elif late and (not late[0].overwritten or any(f.overwritten for f in late[1:])):
            problems.append(f"{tag}: storage of layer {c.storage}: expected the first sharer's fill to wipe and the "
                            f"others to be harmless, got {[f.overwritten for f in late]}")
    return problems


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
        problems += check_census(fixed) + check_census(buggy)
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
            infl_k = times(r.k_inflation) if r.buggy and r.k_inflation == r.k_inflation else "-"
            infl_v = times(r.v_inflation) if r.buggy and r.v_inflation == r.v_inflation else "-"
            lines.append(f"{r.kv_cache_dtype:22s} {r.max_num_seqs:4d} {('on' if r.prefix_caching else 'off'):>6s} "
                         f"{('buggy' if r.buggy else 'fixed'):7s} {ranges(r.damaged):18s} {infl_k:>8s} {infl_v:>8s}  "
                         f"{r.harmless_fills} | {late}")
    if clean16 is not None:
        fixed, buggy = clean16
        same = "identical outputs" if fixed.texts == buggy.texts else "OUTPUTS DIFFER"
        compare(fixed, buggy)
        lines.append(f"{'auto (16/32-bit)':22s} {buggy.max_num_seqs:4d} {'off':>6s} {'buggy':7s} "
                     f"{ranges(buggy.damaged):18s} {'-':>8s} {'-':>8s}  "
                     f"no inline scales: {same} to the fixed engine")
    return "\n".join(lines)


def code_site_diff(context: int = 3) -> str:
    """Defect A's code site as a unified diff, HISTORICAL -> FIX, made from the source of the two versions."""
    import difflib
    import inspect

    from minikv.attention.impl import AttentionImpl
    old = inspect.getsource(AttentionImpl._scale_views_historical).splitlines()
    new = inspect.getsource(AttentionImpl._scale_views_once_per_storage).splitlines()
    return "\n".join(difflib.unified_diff(old, new, "HISTORICAL  minikv/attention/impl.py",
                                           "FIX         minikv/attention/impl.py", lineterm="", n=context))


# ---- one number per quantity: what README, docs and notebook 03 quote, from one computation ------------------
HEADLINE = ("int8_per_token_head", 4, False)    # (format, max_num_seqs, prefix caching) the quantities are taken at
INFLATION_STATISTIC = ("median over the first batch's (token, kv head) {part} rows in the shared storages ({storages}) "
                       "of |{part}_buggy| / |{part}_fixed| (vector norms) right after step 0; "
                       "int8_per_token_head, max_num_seqs=4, prefix caching off")


def shared_storages(run: Run) -> str:
    """'layers 2 and 3': the storages KV-sharing layers read."""
    owners = sorted(set(run.sharing.values()))
    return "layer" + ("s " if len(owners) > 1 else " ") + " and ".join(map(str, owners))


def times(factor: float) -> str:
    """An inflation factor as the prose quotes it: whole factors ("x46")."""
    return f"x{factor:.0f}"


def headline_pair(pairs: list[tuple[Run, Run]]) -> tuple[Run, Run]:
    """The (fixed, buggy) pair of the HEADLINE configuration."""
    for fixed, buggy in pairs:
        if (buggy.kv_cache_dtype, buggy.max_num_seqs, buggy.prefix_caching) == HEADLINE:
            return fixed, buggy
    raise ValueError(f"no run of the headline configuration {HEADLINE} among the pairs")


def quantities(pairs: list[tuple[Run, Run]]) -> dict[str, dict]:
    """{name: {"value", "display", "statistic"}} of the single figures quoted in prose, from the HEADLINE pair.
    A model judged by the fixed run (random weights) has no `damaged_requests` quantity: which of its requests
    came out with other tokens is in the damage table, and notebook 03 shows the damage after one step instead
    (`attention_damage`); every other quantity is fixed by step 0 alone."""
    _, buggy = headline_pair(pairs)
    counts = census_counts(buggy)
    wiped = [f.overwritten for f in buggy.fills if f.overwritten]
    law = buggy.inflation_error
    where = shared_storages(buggy)
    how = ("answered wrongly and differently from the fixed engine" if buggy.judge == "task" else
           "answered with other token ids than the fixed engine (random weights: no answer is right)")
    out = {
        "k_inflation": {"value": round(buggy.k_inflation, 1), "display": times(buggy.k_inflation),
                        "statistic": INFLATION_STATISTIC.format(part="K", storages=where)},
        "v_inflation": {"value": round(buggy.v_inflation, 1), "display": times(buggy.v_inflation),
                        "statistic": INFLATION_STATISTIC.format(part="V", storages=where)},
        "inflation_vs_true_scale": {
            "value": float(f"{law:.1g}"), "display": "< 1e-4" if law < 1e-4 else f"{law:.0e}",
            "statistic": "max over the same K rows of |(|K_buggy| / |K_fixed|) x true scale - 1|"},
        "damaged_requests": {"value": buggy.damaged, "display": ranges(buggy.damaged),
                             "statistic": f"requests (of {len(buggy.texts)}) the buggy engine {how}; "
                                          "int8_per_token_head, max_num_seqs=4"},
        "harmless_fills": {"value": counts["harmless"], "display": str(counts["harmless"]),
                           "statistic": "scale fills of the buggy engine that overwrote no written scale"},
        "wiping_fills": {"value": counts["wiping"], "display": str(counts["wiping"]),
                         "statistic": "late scale fills of the buggy engine that overwrote written scales"},
        "wiped_scales": {"value": wiped, "display": " and ".join(f"{n:,}" for n in wiped) or "none",
                         "statistic": "written scales (K and V) each wiping fill overwrote"},
    }
    if buggy.judge != "task":
        del out["damaged_requests"]
    return out


def damage_rows(pairs: list[tuple[Run, Run]], clean16=None) -> list[list]:
    rows = []
    for fixed, buggy in pairs:
        n = census_counts(buggy)
        rows.append([buggy.kv_cache_dtype, buggy.max_num_seqs, "on" if buggy.prefix_caching else "off",
                     ranges(buggy.damaged), ranges(fixed.damaged), times(buggy.k_inflation),
                     times(buggy.v_inflation), n["harmless"], n["wiping"]])
    if clean16 is not None:
        fixed, buggy = clean16
        same = fixed.texts == buggy.texts
        compare(fixed, buggy)
        rows.append(["auto", buggy.max_num_seqs, "off",
                     "none" if same else "OUTPUTS DIFFER", ranges(fixed.damaged),
                     "-", "-", len(buggy.fills), 0])
    return rows


DAMAGE_COLUMNS = ["kv_cache_dtype", "max_num_seqs", "prefix caching", "damaged (buggy)", "damaged (fixed)",
                  "K inflation", "V inflation", "fills that wiped nothing", "late fills that wiped"]


def upstream_rows(pairs: list[tuple[Run, Run]]) -> list[list]:
    """[quantity, minikv, upstream] for the census and the inflation (upstream: the vLLM fix's description)."""
    q = quantities(pairs)
    up = UPSTREAM_CENSUS
    return [["fills that wiped nothing", q["harmless_fills"]["display"], str(up["harmless"])],
            ["late fills that wiped written scales", q["wiping_fills"]["display"], str(up["wiping"])],
            ["written scales each wiping fill overwrote", q["wiped_scales"]["display"],
             f"{up['wiped'][0]:,} and {up['wiped'][1]:,}"],
            ["K inflation (= 1 / true scale)", q["k_inflation"]["display"], times(UPSTREAM_INFLATION["K"])],
            ["V inflation (= 1 / true scale)", q["v_inflation"]["display"], times(UPSTREAM_INFLATION["V"])]]


def results(pairs: list[tuple[Run, Run]], clean16, command: str, name: str = "scale_wipe",
            extra_tables: dict | None = None) -> dict:
    """The results file's content (RESULTS_SCHEMA: name, command, model, quantities, tables); `extra_tables`
    (the warmup-shape census, the prefix-caching orders) are added after the standard ones."""
    _, buggy = headline_pair(pairs)
    n = len(buggy.texts)
    return {
        "name": name,
        "command": command,
        "model": buggy.model,
        "notebook": NOTEBOOK,
        "quantities": quantities(pairs),
        "tables": {
            "damage": {"caption": f"Damaged requests per configuration ({n} requests: {n // 2} prompts x 2), buggy "
                                  "and fixed engines; inflation: median per (token, kv head) row of the first batch",
                       "columns": DAMAGE_COLUMNS, "rows": damage_rows(pairs, clean16)},
            "census": {"caption": f"Scale fills per storage, buggy engine ({buggy.kv_cache_dtype}, max_num_seqs="
                                  f"{buggy.max_num_seqs}); each fill: layer, when, written scales overwritten",
                       "columns": CENSUS_COLUMNS, "rows": census_rows(buggy)},
            "census_vs_upstream": {"caption": "minikv's census and inflation next to upstream's (gemma-4-E2B-it, "
                                              "from vLLM pull request #51061)",
                                   "columns": ["quantity", f"minikv ({buggy.model})", "upstream (gemma-4-E2B-it)"],
                                   "rows": upstream_rows(pairs)},
            **(extra_tables or {}),
        },
    }


def format_quantities(pairs: list[tuple[Run, Run]]) -> str:
    """One line per quantity: name, display, statistic (what notebook 03 and the repro print)."""
    return "\n".join(f"{name:24s} {q['display']:14s} {q['statistic']}" for name, q in quantities(pairs).items())


def warmup_shape_runs(prompts, max_num_seqs: int, device="cpu", backend="torch", *, model: str = MODEL,
                      max_tokens: int = 12) -> dict[str, list[int]]:
    """{warmup shape: damaged requests of the buggy engine} (damage judged against a fixed dummy-warmup engine)."""
    fixed = run_engine("int8_per_token_head", max_num_seqs, False, False, prompts, device, backend, max_tokens,
                       model=model)
    out = {}
    for shape in ("dummy", "capture"):
        buggy = run_engine("int8_per_token_head", max_num_seqs, False, True, prompts, device, backend, max_tokens,
                           model=model, warmup=shape)
        compare(fixed, buggy)
        out[shape] = buggy.damaged
    return out


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
    params = minikv.SamplingParams(max_tokens=max_tokens, ignore_eos=default_ignore_eos(model))
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
    """The buggy engine driven step by step while requests arrive over several steps (0 to max_num_seqs of them
    before each step, seeded), as a server sees them: the damaged set is the first scheduled batch, whatever it
    holds. (A model judged by the fixed run: a fixed engine fed the same arrivals is the reference.)"""
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
    """The buggy engine's census and damage under each of `WARMUP_CASES` (int8_per_token_head, no prefix
    caching), damage judged against one fixed engine: by the answers (`damage="tokens"`, `compare`), or by the
    prefill step's attention outputs in the sharing layers (`damage="attention"`, `attention_damage`). `runs`:
    an existing (fixed, buggy) pair of these prompts and settings, used for the fixed engine and the dummy row."""
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
    max_num_seqs: which requests come out damaged (against a fixed engine with the same settings). A model judged
    by the fixed run (random weights) is judged by its prefill-step attention outputs (`attention_damage`): a copy
    that reuses wiped blocks attends over them at its own prefill, while its 4 tokens may not differ yet."""
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
    """Prompts without a full block: exactly the first batch in every order; with full blocks, copies after the
    first batch reuse its wiped blocks, and adjacent copies stay inside it only when max_num_seqs is a multiple of
    the copy count."""
    problems = []
    for r in runs:
        expect = r.prompt_set == "no full block" or (r.order == "adjacent" and r.max_num_seqs % copies == 0)
        if r.first_batch_only != expect or not set(range(r.max_num_seqs)) <= set(r.damaged):
            problems.append(f"prefix caching, {r.order}, {r.prompt_set}, max_num_seqs={r.max_num_seqs}: damaged "
                            f"{ranges(r.damaged)}")
    return problems


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
                     reinit_scales_on_wake=reinit, num_blocks=engine_blocks(model, prompts, max_num_seqs, max_tokens))
    params = minikv.SamplingParams(max_tokens=max_tokens, ignore_eos=default_ignore_eos(model))
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


def main(argv: list[str] | None = None) -> int:
    from minikv.argtypes import UsageParser, positive_int
    p = UsageParser(prog="minikv repro scale-wipe", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL,
                   help=f"a shipped model ({MODEL}: trained; {E2B_MODEL}: gemma-4-E2B's topology, random weights) "
                        "or the path of a Gemma-4 checkpoint directory (config.json, safetensors, tokenizer)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default=None, choices=("triton", "torch"),
                   help="kernel backend (default: triton on cuda; torch on cpu, where the Triton interpreter would "
                        "take many minutes: the defect lives in the engine's Python, which both backends run)")
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
    args.backend = args.backend or ("triton" if args.device.startswith("cuda") else "torch")
    if args.requests < 2 * max(args.max_num_seqs):
        p.error(f"--requests {args.requests} is too few for --max-num-seqs {max(args.max_num_seqs)}: need at least "
                f"{2 * max(args.max_num_seqs)}, so that a batch after the first exists")
    model = args.model

    start = time.perf_counter()
    prompts = make_prompts(args.requests, copies=2, model=model)
    configs = list(itertools.product(args.formats, args.max_num_seqs, (False, True)))
    kw = {"max_tokens": args.max_tokens, "model": model}
    by_attention = args.damage == "attention"
    pairs = []
    for fmt, seqs, pc in tqdm(configs, desc="scale-wipe configurations"):
        fixed = run_engine(fmt, seqs, pc, False, prompts, args.device, args.backend, capture_attention=by_attention,
                           **kw)
        buggy = run_engine(fmt, seqs, pc, True, prompts, args.device, args.backend, capture_attention=by_attention,
                           **kw)
        compare(fixed, buggy)
        if by_attention:
            by_tokens, buggy.damaged = buggy.damaged, attention_damage(fixed, buggy)
            tqdm.write(f"{fmt} max_num_seqs={seqs} prefix caching {'on' if pc else 'off'}: attention outputs differ "
                       f"for requests {ranges(buggy.damaged)}; token ids differ for {ranges(by_tokens)}")
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
        import sys
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
