"""Defect A, step by step: what each layer did to the shared storages, and how one wiped key becomes a wrong token.
See docs/internals.md#repro-scale-wipe-trace."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from minikv.repro.common import dequantized_rows
from minikv.repro.scale_wipe import MODEL, layer_index

WARMUP = "warmup"


@dataclass
class Timeline:
    """Per layer and column ("warmup", "step 0", "step 1", ...): the events of that layer, in order."""

    buggy: bool
    num_layers: int
    columns: list[str]
    cells: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    batches: dict[str, tuple[int, ...]] = field(default_factory=dict)    # column -> requests that ran
    phases: dict[str, str] = field(default_factory=dict)                 # column -> "prefill" / "decode"
    storages: dict[int, int] = field(default_factory=dict)               # layer -> the layer whose storage it reads

    def events(self, layer: int, column: str) -> list[str]:
        return self.cells.get((layer, column), [])

    def reads_wiped(self) -> dict[int, list[str]]:
        """{layer: the columns in which it read wiped rows} (layers that never did are left out)."""
        out: dict[int, list[str]] = {}
        for (layer, column), events in sorted(self.cells.items(), key=lambda kv: (kv[0][0], self.columns.index(kv[0][1]))):
            if "read wiped" in events:
                out.setdefault(layer, []).append(column)
        return out


def _wiped_slots(fill, block_size: int) -> set[int]:
    """The slots whose K or V scale the fill overwrote (the census keeps the scales it replaced)."""
    k, v = fill.wiped_k_scales, fill.wiped_v_scales
    written = ((k != 0) & (k != 1)).any(dim=-1) | ((v != 0) & (v != 1)).any(dim=-1)     # [blocks, block_size]
    blocks, offsets = torch.nonzero(written, as_tuple=True)
    return set((blocks * block_size + offsets).tolist())


def engine(buggy: bool, **kw):
    """A tiny-gemma4 engine with an int8 per-token-head cache on CPU (torch backend), buggy or fixed."""
    import minikv
    kw = {"kv_cache_dtype": "int8_per_token_head", "max_num_seqs": 4, "device": "cpu", "backend": "torch", **kw}
    return minikv.LLM(model=MODEL, reintroduce=("scale-wipe",) if buggy else (), **kw)


def trace_run(llm, prompts: list[str], max_tokens: int = 4) -> tuple[Timeline, list]:
    """Serve `prompts` on a fresh engine one step at a time; return its Timeline and the finished outputs."""
    import minikv
    bs = llm.config.cache.block_size
    pools = [a.pool for a in llm.attention_layers.values() if a.kv_sharing_target is None]
    owner_of = {n: a.owner for n, a in llm.attention_layers.items()}
    historical = any(a.impl.historical_scale_init for a in llm.attention_layers.values())
    timeline = Timeline(historical, len(llm.attention_layers), [WARMUP],
                        storages={layer_index(n): layer_index(o) for n, o in owner_of.items()})
    for f in llm.census.fills:                                   # the fills so far were the warmup's
        timeline.cells.setdefault((layer_index(f.layer), WARMUP), []).append("wipe" if f.overwritten else "fill")
    ids = [llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=max_tokens)) for p in prompts]
    wiped: dict[str, set[int]] = {pool: set() for pool in pools}
    done = {}
    while llm.has_unfinished():
        out = llm.step()
        column = f"step {out.step}"
        timeline.columns.append(column)
        timeline.batches[column] = out.request_ids
        timeline.phases[column] = out.phase
        written = {s for slots in out.slot_mapping.values() for s in slots}
        read = {s for r in out.request_ids for s in out.block_slots(r, bs)}
        fills = {f.layer: f for f in out.trace.scale_fills}
        for event in out.trace.events:
            layer, cell = layer_index(event.layer), []
            if event.wrote:
                wiped[event.pool] -= written
                cell.append("write")
            fill = fills.get(event.layer)
            if fill is not None:
                if fill.overwritten:
                    wiped[event.pool] |= _wiped_slots(fill, bs)
                cell.append("wipe" if fill.overwritten else "fill")
            if event.read:
                cell.append("read wiped" if wiped[event.pool] & read else "read")
            timeline.cells[(layer, column)] = cell
        done.update({o.request_id: o for o in out.finished})
    return timeline, [done[i] for i in ids]


@dataclass
class CausalChain:
    """One first-batch request, fixed engine vs buggy engine."""

    request: int
    layer: str                     # the KV-sharing layer whose attention is shown
    storage: str                   # the layer whose storage it reads
    head: int                      # query head (its kv head is head // group)
    k_fixed: torch.Tensor          # [tokens, kv_heads, head_size] K of the request in the storage, dequantized
    k_buggy: torch.Tensor
    attn_fixed: torch.Tensor       # [tokens] attention weights of the fixed query over the fixed keys
    attn_buggy: torch.Tensor       # ... over the buggy engine's (wiped) keys
    diverging_step: int            # the first generation step whose sampled token differs
    top_fixed: list[tuple[str, float]]   # (token text, logit) top-k at that step, fixed engine
    top_buggy: list[tuple[str, float]]
    chosen_fixed: str
    chosen_buggy: str
    text_fixed: str
    text_buggy: str
    tokens_fixed: list[str] = field(default_factory=list)    # every generated token, as text, fixed engine
    tokens_buggy: list[str] = field(default_factory=list)


def _serve_recording(llm, prompts, max_tokens, layer: str, storage: str, request: int):
    """Serve step by step; keep every step's logits per request, `layer`'s query at step 1 and the request's
    dequantized K rows in `storage`'s pool after step 0."""
    import minikv
    logits_by_step: list[dict[int, torch.Tensor]] = []
    model, current = llm.model, {}
    original = model.compute_logits

    def recording(hidden):
        logits = original(hidden)
        current["logits"] = logits.detach().clone()
        return logits

    model.compute_logits = recording           # an instance attribute: this engine only
    try:
        ids = [llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=max_tokens)) for p in prompts]
        rid = ids[request]
        sampled, k_rows, query, done = [], None, None, {}
        bs = llm.config.cache.block_size
        pool = llm.attention_layers[storage].pool
        layout = llm.arena.layout(pool)
        while llm.has_unfinished():
            out = llm.step(capture=True)
            if rid in out.request_ids:
                row = out.request_ids.index(rid)
                logits_by_step.append(current["logits"][row])
                sampled.append(out.sampled[rid])
                if out.step == 0:
                    k_rows, _ = dequantized_rows(layout, llm.arena.pool(pool), out.block_slots(rid, bs))
                if out.step == 1:
                    event = next(e for e in out.trace.events if e.layer == layer)
                    query = event.tensors["q"][row]        # decode: one token per request
            done.update({o.request_id: o for o in out.finished})
    finally:
        del model.compute_logits
    return logits_by_step, sampled, k_rows, query, done[rid].text


def causal_chain(prompts: list[str], request: int = 0, layer: int = 4, head: int = 0, max_tokens: int = 12,
                 top_k: int = 5, **engine_kw) -> CausalChain:
    """Follow `request` (of the first batch) through a fixed and a buggy engine; see `CausalChain`."""
    runs = {}
    for buggy in (False, True):
        llm = engine(buggy, **engine_kw)
        name = f"model.layers.{layer}.self_attn"
        storage = llm.attention_layers[name].kv_sharing_target
        if storage is None:
            raise ValueError(f"layer {layer} owns its KV cache; pick a KV-sharing layer "
                             f"({sorted(llm.model_config.kv_sharing)})")
        runs[buggy] = (_serve_recording(llm, prompts, max_tokens, name, storage, request), llm)
    (lf, sf, kf, qf, tf), llm = runs[False]
    (lb, sb, kb, _, tb), _ = runs[True]
    impl = llm.attention_layers[name].impl
    kv_head = head // (impl.num_heads // impl.layout.num_kv_heads)
    weights = []
    for k in (kf, kb):
        # The query attends over the prompt's keys as stored after step 0 (the decode token's own key is left out:
        # it is written fresh, with a right scale, in both engines).
        scores = (k[:, kv_head].double() @ qf[head].double()) * impl.sm_scale
        weights.append(torch.softmax(scores, dim=0).float())
    step = next((i for i, (a, b) in enumerate(zip(sf, sb)) if a != b), None)
    if step is None:
        raise ValueError(f"request {request} generated the same tokens in both engines: not a damaged request")
    tok = llm.tokenizer

    def top(logits):
        values, indices = logits.float().topk(top_k)
        return [(tok.decode([int(i)]), float(v)) for v, i in zip(values, indices)]

    return CausalChain(request, name, storage, head, kf, kb, weights[0], weights[1], step, top(lf[step]),
                       top(lb[step]), tok.decode([sf[step]]), tok.decode([sb[step]]), tf, tb,
                       [tok.decode([t]) for t in sf], [tok.decode([t]) for t in sb])


def prefix_sources(step_outputs, block_size: int) -> dict[int, int]:
    """{request: the earlier request whose blocks it reused from the prefix cache} from a run's StepOutputs."""
    owner_of_block: dict[int, int] = {}
    sources = {}
    for out in step_outputs:
        if not out.is_prefill:
            continue
        for rid in out.request_ids:
            table = out.block_tables[rid]
            cached = out.num_cached_tokens.get(rid, 0) // block_size
            if cached:
                sources[rid] = owner_of_block[table[0]]
            for b in table[cached:]:
                owner_of_block[b] = rid
    return sources


@dataclass
class StorageMap:
    """The KV storages after one step: per storage, its blocks in use by request and the rows whose scales a
    late fill wiped."""

    step: int
    storages: list[dict]
    num_blocks: int
    layout: object
    zoom: tuple


def storage_map(llm, out) -> StorageMap:
    """What `out` (a StepOutput of `llm`, read right after that step) left in every KV storage."""
    bs = llm.config.cache.block_size
    owners = [n for n, a in llm.attention_layers.items() if a.kv_sharing_target is None]
    fills = {f.layer: f for f in out.trace.scale_fills if f.overwritten}
    storages, zoom = [], None
    for owner in owners:
        readers = [n for n, a in llm.attention_layers.items() if a.kv_sharing_target == owner]
        wiper = next((n for n in readers if n in fills), None)
        wiped = _wiped_slots(fills[wiper], bs) if wiper else set()
        blocks = []
        for rid in out.request_ids:
            slots = out.block_slots(rid, bs)
            for b in dict.fromkeys(s // bs for s in slots):
                mine = [s for s in slots if s // bs == b]
                blocks.append((b, rid, len(mine), len([s for s in mine if s in wiped])))
        storages.append({"pool": f"kv.{owner}", "owner": layer_index(owner),
                         "readers": [layer_index(n) for n in readers],
                         "wiped_by": layer_index(wiper) if wiper else None, "blocks": blocks})
        if wiper and zoom is None and blocks:
            b, rid = blocks[0][0], blocks[0][1]
            f = fills[wiper]
            k, v = f.wiped_k_scales[b], f.wiped_v_scales[b]          # [block_size, heads]: the scales it replaced
            rows = [(o, bool(((k[o] != 0) & (k[o] != 1)).any()), bool(((v[o] != 0) & (v[o] != 1)).any()))
                    for o in range(bs)]
            zoom = (f"kv.{owner}", b, rid, rows)
    layout = llm.arena.layout(f"kv.{owners[0]}")
    return StorageMap(out.step, storages, llm.arena.specs[f"kv.{owners[0]}"].num_blocks, layout, zoom)
