"""Defect B1, step by step: who writes and reads which bytes of the arena when, and how the doubled stride turns
into a wrong token of a request whose own cross blocks never left their pool.
See docs/internals.md#repro-cross-stride-trace."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from minikv.repro.cross_stride import MODEL, engine

WRITE, STRAY, READ, OVERWRITTEN = "write", "write stray", "read", "read overwritten"


@dataclass
class CrossTimeline:
    """Per layer (in execution order) and column ("step 0", "step 1", ...): what the layer did, in order."""

    buggy: bool
    layers: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    victims: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    culprits: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    phases: dict[str, str] = field(default_factory=dict)
    stray_into: dict[str, list[str]] = field(default_factory=dict)   # layer -> regions its stray bytes landed in
    wrong: list[int] = field(default_factory=list)                   # requests whose token ids differ from auto
    title: str = ""

    def events(self, layer: str, column: str) -> list[str]:
        return self.cells.get((layer, column), [])

    def predicted_wrong(self) -> list[int]:
        """Every request one of whose reads was overwritten (what the byte map says must go wrong)."""
        return sorted({r for rs in self.victims.values() for r in rs})

    def first_overwritten_read(self, request: int) -> tuple[str, str] | None:
        """(layer, column) of the request's first overwritten read, in execution order."""
        for column in self.columns:
            for layer in self.layers:
                if request in self.victims.get((layer, column), []):
                    return layer, column
        return None


def short_name(name: str) -> str:
    """'decoder.1.cross_attn' or 'cross.decoder.1.cross_attn' -> 'cross 1'; '...self_attn' -> 'self 1'."""
    parts = name.split(".")
    i = parts.index("decoder") if "decoder" in parts else -1
    if i < 0 or i + 2 >= len(parts) + 1:
        return name
    return f"{'cross' if parts[-1].startswith('cross') else 'self'} {parts[i + 1]}"


class _ByteOwners:
    """The arena's bytes, each remembering the (layer, request) that wrote it last (-1: never written)."""

    def __init__(self, arena):
        self.arena = arena
        self.owner = np.full(arena.storage.numel(), -1, dtype=np.int64)
        self.regions = arena.byte_map()

    def region_of(self, byte: int) -> str:
        kind, name, *_ = next(r for r in self.regions if r[2] <= byte < r[3])
        return name if kind == "pool" else f"guard after {name}"


def _slot_ranges(start: int, layout, slots, block_size: int):
    """[(first byte, end)] in the arena of the K and the V rows of every slot, as `layout` addresses them."""
    out = []
    for s in slots:
        b, o = divmod(int(s), block_size)
        for kv in (0, 1):
            x = start + layout.row_offset(b, kv, o, 0)
            out.append((x, x + layout.slot_bytes))
    return out


def _pool_of(llm, layer: str) -> tuple[str, object]:
    """(arena pool name, the layout the layer's backend addresses it with)."""
    a = llm.attention_layers[layer]
    if a.kind == "cross":
        return next(n for n in llm.arena.offsets if n.startswith("cross.") and n.endswith(layer)), a.impl.layout
    return f"kv.{layer}", llm.arena.layout(f"kv.{layer}")


def trace_run(llm, prompts: list[str], reference: list[list[int]] | None = None, title: str = "",
              after_step=lambda out: None) -> tuple[CrossTimeline, list]:
    """Serve `prompts` on `llm` (a fresh tiny-t5 engine) step by step; see `CrossTimeline`. `after_step` sees each
    StepOutput (for example to copy the arena after the context step)."""
    import minikv
    task = minikv.tasks.for_model(MODEL)
    bs = llm.config.cache.block_size
    buggy = "cross-stride" in llm.config.reintroduce
    owners = _ByteOwners(llm.arena)
    ids = [llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p))) for p in prompts]
    index = {rid: i for i, rid in enumerate(ids)}
    order: list[str] = []
    timeline = CrossTimeline(buggy, order, [], title=title)
    cross_slots: dict[int, tuple[int, ...]] = {}
    done = {}
    while llm.has_unfinished():
        out = llm.step()
        column = f"step {out.step}"
        timeline.columns.append(column)
        timeline.phases[column] = out.phase
        for event in out.trace.events:
            layer = event.layer
            if layer not in order:
                order.append(layer)
            op = list(llm.attention_layers).index(layer)
            pool, layout = _pool_of(llm, layer)
            start = llm.arena.offsets[pool]
            lo, hi = start, start + llm.arena.pool(pool).numel()
            cell = []
            if event.wrote:
                stray = set()
                for rid in out.request_ids:
                    slots = out.cross_slot_mapping[rid] if event.kind == "cross" else out.slot_mapping[rid]
                    if event.kind == "cross":
                        cross_slots[rid] = slots
                    for x0, x1 in _slot_ranges(start, layout, slots, bs):
                        owners.owner[x0:x1] = op * 10_000 + index[rid]
                        if x0 < lo or x1 > hi:
                            stray |= {owners.region_of(x) for x in (max(x0, hi), x1 - 1) if not lo <= x < hi}
                if stray:
                    timeline.stray_into[layer] = sorted(set(timeline.stray_into.get(layer, [])) | stray)
                cell.append(STRAY if stray else WRITE)
            if event.read:
                victims, culprits = [], set()
                for rid in out.request_ids:
                    slots = cross_slots[rid] if event.kind == "cross" else out.block_slots(rid, bs)
                    mine = op * 10_000 + index[rid]
                    hit = False
                    for x0, x1 in _slot_ranges(start, layout, slots, bs):
                        found = owners.owner[x0:x1]
                        others = found[found != mine]
                        if others.size:
                            hit = True
                            culprits |= {list(llm.attention_layers)[int(o) // 10_000] for o in np.unique(others)
                                         if o >= 0}
                    if hit:
                        victims.append(index[rid])
                if victims:
                    timeline.victims[(layer, column)] = victims
                    timeline.culprits[(layer, column)] = sorted(culprits)
                cell.append(OVERWRITTEN if victims else READ)
            timeline.cells[(layer, column)] = cell
        after_step(out)
        done.update({o.request_id: o for o in out.finished})
    outs = [done[i] for i in ids]
    if reference is not None:
        timeline.wrong = [i for i, (o, r) in enumerate(zip(outs, reference)) if o.token_ids != r]
    return timeline, outs


@dataclass
class CrossCausalChain:
    """One damaged request: from the doubled stride to the overwritten self-attention rows to the first wrong
    token."""

    request: int
    culprit: str                 # the cross layer whose stray write covered the victim's rows
    victim_layer: str            # the self-attention layer whose rows were covered
    pool_start: int
    pool_end: int
    doubled: list[tuple[int, int, int, int, int, int]]
    victim_blocks: list[tuple[int, int, int]]         # (block, arena start, arena end) of the victim's self blocks
    rows: list[tuple[int, bool, bool]]
    tokens_fixed: list[str]
    tokens_buggy: list[str]
    diverging: int
    first_overwritten_read: tuple[str, str]
    factor: float
    blocks: int
    regions: list[tuple[str, str, int, int]] = field(default_factory=list)   # the arena's KVArena.byte_map()


def causal_chain(prompts: list[str], factor: float = 1.5, request: int = 0, backend: str = "torch",
                 device: str = "cpu") -> CrossCausalChain:
    """Follow `request` through a buggy (historical stride, sanitizer off) and a fixed engine with cross pools of
    floor(factor x need) blocks; see `CrossCausalChain`."""
    import minikv
    need = engine("fp8", device, backend).cross_blocks_needed(prompts)
    blocks = max(1, math.floor(factor * need))
    runs = {}
    for buggy in (False, True):
        llm = engine("fp8", device, backend, max_num_seqs=len(prompts), cross_pool_blocks=blocks, sanitize=False,
                     repro=minikv.ReproConfig(check_layout=False), reintroduce=("cross-stride",) if buggy else ())
        first = {}

        def keep_first(out, llm=llm, first=first):
            if out.step == 0:
                first.update(out=out, arena=llm.arena.storage.clone())

        timeline, outs = trace_run(llm, prompts, after_step=keep_first)
        runs[buggy] = (llm, first, outs[request], timeline)
    timeline = runs[True][3]
    where = timeline.first_overwritten_read(request)
    if where is None:
        raise ValueError(f"request {request} read nothing overwritten at {factor:g}x: not damaged by the overrun")
    victim_layer = where[0]
    culprits = timeline.culprits[where]
    culprit = next((c for c in culprits if runs[True][0].attention_layers[c].kind == "cross"), culprits[0])
    llm, first, out_buggy, _ = runs[True]
    _, first_fixed, out_fixed, _ = runs[False]
    step0 = first["out"]
    ids = list(step0.request_ids)                   # a fresh engine: request i has id i, all in the first step
    bs = llm.config.cache.block_size
    pool, layout = _pool_of(llm, culprit)
    start = llm.arena.offsets[pool]
    real = llm.arena.layout(pool)
    doubled = [(b, ids.index(r), start + real.row_offset(b, 0, 0, 0), start + real.row_offset(b + 1, 0, 0, 0),
                start + layout.row_offset(b, 0, 0, 0), start + layout.row_offset(b + 1, 0, 0, 0))
               for r in step0.request_ids for b in step0.cross_block_tables[r]]
    vpool, vlayout = _pool_of(llm, victim_layer)
    vstart = llm.arena.offsets[vpool]
    rid = ids[request]
    victim_blocks = [(b, vstart + vlayout.row_offset(b, 0, 0, 0), vstart + vlayout.row_offset(b + 1, 0, 0, 0))
                     for b in step0.block_tables[rid]]
    rows = []
    for position, slot in enumerate(step0.block_slots(rid, bs)):
        flags = []
        for kv in (0, 1):
            b, o = divmod(slot, bs)
            x = vstart + vlayout.row_offset(b, kv, o, 0)
            flags.append(not torch.equal(first["arena"][x:x + vlayout.slot_bytes],
                                         first_fixed["arena"][x:x + vlayout.slot_bytes]))
        rows.append((position, *flags))
    tok = llm.tokenizer
    fixed_tokens = [tok.decode([t]) for t in out_fixed.token_ids]
    buggy_tokens = [tok.decode([t]) for t in out_buggy.token_ids]
    diverging = next((i for i, (a, b) in enumerate(zip(fixed_tokens, buggy_tokens)) if a != b),
                     min(len(fixed_tokens), len(buggy_tokens)))
    return CrossCausalChain(request, culprit, victim_layer, start, start + llm.arena.pool(pool).numel(), doubled,
                            victim_blocks, rows, fixed_tokens, buggy_tokens, diverging, where, factor, blocks,
                            llm.arena.byte_map())

