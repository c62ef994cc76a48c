"""Defect A's runs: a fixed and a buggy engine serve the same prompts; what each served and what it wiped.
See docs/internals.md#repro-scale-wipe-run."""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import torch

from minikv.kernels.formats import PER_TOKEN_HEAD_KV_CACHE_DTYPES
from minikv.repro.common import dequantized_rows, stored_scales

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
    """KV blocks for a checkpoint directory's runs; None for a shipped model."""
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
    batch's K/V in the shared storages right after step 0."""
    import minikv
    task = task_of(model)
    ignore_eos = default_ignore_eos(model) if ignore_eos is None else ignore_eos
    llm = minikv.LLM(model=model, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                     enable_prefix_caching=prefix_caching, device=device, backend=backend,
                     reintroduce=("scale-wipe",) if buggy else (), repro=minikv.ReproConfig(warmup=warmup),
                     num_blocks=engine_blocks(model, prompts, max_num_seqs, max_tokens))
    for name, a in llm.attention_layers.items():
        if layer_index(name) in touch_before_start:
            a.impl.scale_views(a.kv_cache)
    layout = llm.kv_layout
    captured: dict = {}
    params = minikv.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)
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
    """Requests whose prefill-step attention outputs in the KV-sharing layers differ from the fixed engine's
    (both runs with `capture_attention`)."""
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
