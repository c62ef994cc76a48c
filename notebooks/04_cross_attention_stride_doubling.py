# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Cross attention: stride doubling (B1) and the FP8 context read (B2)
#
# An [encoder-decoder](../docs/glossary.md#encoder-decoder-and-cross-attention) keeps two kinds of KV cache. The
# decoder's self-attention grows by one token per step, like any decoder-only model. Its
# [cross attention](../docs/glossary.md#encoder-decoder-and-cross-attention) looks at the *encoder's* output, which
# is fixed once the request starts: those keys and values are projected once, stored in a separate **cross pool**
# (a [paged](../docs/glossary.md#page-paged) pool of blocks, like the self-attention cache), and read again at
# every decode step.
#
# TensorRT-LLM's PyTorch backend had two defects on that path when the KV cache was
# [FP8](../docs/glossary.md#fp8) (issue
# [#19861](https://github.com/NVIDIA/TensorRT-LLM/issues/19861); pull request
# [#20958](https://github.com/NVIDIA/TensorRT-LLM/pull/20958) carries both fixes; the box under the first code
# cell has upstream's steps, and the project's page is
# [docs/defects/cross-stride-fp8-context.md](../docs/defects/cross-stride-fp8-context.md)):
#
# * **B1, `cross-stride`.** The cross-attention layer built its attention backend without the model's quantization
#   config. The cache manager sized the cross pool for FP8 (1 byte per element); the backend addressed it at the
#   model's [element size](../docs/glossary.md#element-size) (2 bytes for a 16-bit model), so its
#   [stride](../docs/glossary.md#stride) from one block to the next is doubled. Every block therefore sits at
#   twice its real offset. Writes
#   and reads use the same wrong stride, so with a big enough pool nothing looks wrong, and with a smaller one the
#   addresses run past the end of the pool.
# * **B2, `cross-fp8-context-read`.** With the addressing fixed, the fused context-attention kernel reads the
#   encoder K/V back from the FP8 cross pool, but it was told the cache's data type only when the "paged context
#   FMHA" option was on. Without that option it finds the right blocks but decodes the FP8 bytes inside them as
#   16-bit values, so the first decoder step sees garbage while the decode steps, which use another kernel, read
#   correctly.
#
# Upstream, a flan-t5-base run with an FP8 cache and a 768-block cross pool crashed before the fix (the PR's
# description says that below twice the needed blocks the process died with an illegal memory access or returned
# wrong tokens silently). After the fix it decoded, with token ids equal to the default-cache run. On the fused
# path, 14 backend-matrix cases were off from the golden by about 1e5.
#
# This notebook reproduces both on `tiny-t5`, a T5 (3 encoder and 3 decoder layers, relative position bias in
# self-attention, none in cross-attention, no attention scaling) trained here to write the distinct characters
# of a string in alphabet order, so every answer is simply right or wrong. It runs as a **16-bit model**
# (float16 on the CPU: every engine below passes `dtype=torch.float16` through `cross_stride.engine`, since
# tiny-t5's registry default on a CPU is float32), as flan-t5-base did upstream; exercise 1 (section 7) asks what
# changes for a float32 model. Terms: the [glossary](../docs/glossary.md). Both versions of each code site sit side by side in `minikv/attention/cross.py`, and
# `LLM(..., reintroduce=(...))` picks the historical one for a single engine. Everything runs on the CPU.

# %%
# %matplotlib inline
import math
import os

os.environ.setdefault("TQDM_DISABLE", "1")       # no progress bars in recorded outputs (use_tqdm=False as well)

import torch

import minikv
from minikv.defects import provenance
from minikv.viz import cross_stride as vcs
from minikv.attention.cross import B1_SITES, CrossAttentionImpl, CrossAttentionModule, CrossBackendBuilder
from minikv.repro import cross_stride
from minikv.repro.common import ranges

torch.manual_seed(0)
provenance.show("cross-stride")    # what upstream said, and when (minikv/defects/provenance.py)
TASK = minikv.tasks.for_model(cross_stride.MODEL)
print(f"{cross_stride.MODEL}: task {TASK.name!r}, e.g. 'banana42' -> {TASK.expected('banana42', 8)!r}; "
      f"model dtype here: {cross_stride.model_dtype('cpu')}")
for name in ("cross-stride", "cross-fp8-context-read"):
    d = minikv.bugs.DEFECTS[name]
    print(f"{d.name}: {d.summary}\n  code site: {d.code_site}")

# %% [markdown]
# Everything `minikv repro cross-stride` measures is computed once here, by the same function the command uses
# (`cross_stride.measure`, several seconds): the B1 pool-size grid, the layout-contract check, the three B2 context
# paths and the identical-request check. It runs on `backend="torch"`, the pure-PyTorch references of the Triton
# kernels, with the same byte addressing. The numbers printed below are the `display` strings of
# `results/cross_stride.json`, computed by `cross_stride.quantities`.

# %%
m = cross_stride.measure(requests=6, device="cpu", backend="torch")
Q = cross_stride.quantities(m)
prompts, need = m.prompts, m.need
reference = cross_stride.reference_tokens(prompts, backend="torch")
print(f"{len(prompts)} held-out prompts, {need} cross blocks needed at once "
      f"(cross_blocks_needed = {Q['cross_blocks_needed']['display']})")


def cross_layers(llm):
    """The cross-attention layers of an engine, in model order (each with the impl its backend built)."""
    return [a for a in llm.attention_layers.values() if a.kind == "cross"]


def one_engine(**kwargs):
    """A tiny-t5 engine on the CPU, 16-bit, with an FP8 cache; kwargs override the defaults."""
    args = dict(kv_cache_dtype="fp8", device="cpu", backend="torch", max_num_seqs=6, seed=0)
    args.update(kwargs)
    return cross_stride.engine(**args)


def params_for(prompt_list):
    return [minikv.SamplingParams(temperature=0, max_tokens=TASK.max_tokens(p)) for p in prompt_list]


def serve(llm, prompt_list, after_step=lambda out: None, capture=False):
    """add_request for every prompt, then step until all finish; `after_step` sees each StepOutput."""
    ids = [llm.add_request(p, sp) for p, sp in zip(prompt_list, params_for(prompt_list))]
    done = {}
    while llm.has_unfinished():
        out = llm.step(capture=capture)
        after_step(out)
        done.update({o.request_id: o for o in out.finished})
    return [done[i] for i in ids]


# %% [markdown]
# ## 1. The encoder-decoder flow: write once, read at every step
#
# One request, an FP8 cache, all fixes in place, on the **Triton kernels** (in the interpreter). The engine runs
# the encoder once. At the decoder's first (context) step, each of the three cross-attention layers projects K
# and V from the encoder output and writes them into its cross pool. Every later step only reads them.
#
# We drive the engine one `step()` at a time and, after each step, count the token slots whose bytes changed in
# every pool. (Slots, not bytes: whether one FP8 byte happens to equal the byte it replaces depends on the last
# bits of float math, which differ between CPUs; a slot's K and V bytes all staying the same does not happen.)
# `step(capture=True)` keeps each layer's inputs, so we can see whether a cross layer was handed fresh K/V.

# %%
fixed = one_engine(backend="triton", max_num_seqs=1)
pool_names = [name for kind, name, *_ in fixed.arena.byte_map() if kind == "pool"]
cross_names = [n for n in pool_names if n.startswith("cross.")]
self_names = [n for n in pool_names if n.startswith("kv.")]
print("pools in the arena, in address order:", pool_names)

prompt = TASK.prompts(1, seed=0, num_tokens=8)[0]
kinds, changes, projected = [], [], []       # one entry per step
snapshot = {n: fixed.arena.pool(n).clone() for n in pool_names}


def changed_slots(layout, before, after):
    """Token slots with any changed byte in their K or V rows; a pool is [blocks, K/V, slots, slot bytes]."""
    shape = (-1, 2, layout.block_size, layout.slot_bytes)
    return int((before.view(shape) != after.view(shape)).any(dim=3).any(dim=1).sum())


def count_changed_slots(step):
    kinds.append("context" if step.is_prefill else "decode")
    changes.append({n: changed_slots(fixed.arena.layout(n), snapshot[n], fixed.arena.pool(n)) for n in pool_names})
    snapshot.update({n: fixed.arena.pool(n).clone() for n in pool_names})
    projected.append([e.tensors["k"] is not None for e in step.trace.events if e.kind == "cross"])


out = serve(fixed, [prompt], count_changed_slots, capture=True)[0]
print(f"prompt {prompt!r} ({len(prompt)} encoder tokens) -> {out.text!r}; right: {TASK.check(prompt, out.text)}")
short = [n.split(".")[0] + n.split(".")[2] for n in pool_names]
print("\ntoken slots written in each pool by each step (crossL / kvL: layer L's cross / self-attention pool):")
print(f"{'step':>4s} {'kind':8s} {'K/V projected':13s} " + " ".join(f"{s:>6s}" for s in short))
for i, (kind, proj, changed) in enumerate(zip(kinds, projected, changes)):
    print(f"{i:4d} {kind:8s} {str(all(proj)):13s} " + " ".join(f"{changed[n]:6d}" for n in pool_names))

assert TASK.check(prompt, out.text)
assert kinds[0] == "context" and set(kinds[1:]) == {"decode"} and len(projected) == len(kinds)
assert all(changes[0][n] == len(prompt) for n in cross_names)                   # every encoder token, once ...
assert all(step[n] == 0 for step in changes[1:] for n in cross_names)           # ... and never again
assert all(step[n] == 1 for step in changes for n in self_names)                # self-attention: one per step
assert all(projected[0]) and not any(any(p) for p in projected[1:])

# %% [markdown]
# The cross pools change at step 0 only: the encoder's K/V for this request are written once. The self-attention
# pools change at every step, because every step feeds one new token (the decoder start token first, then the
# last sampled one) and writes its slot. At decode steps the cross layers get no K/V and read the pool instead.
# So the cross pool must be read back exactly as it was written, at every step of the request.

# %% [markdown]
# ## 2. B1: the allocator and the backend disagree about the element size
#
# The cache manager sizes every pool from one `KVLayout`, the engine's cache config. The cross backend gets its
# own layout from its quantization config. Upstream's layer gets its backend in one of two construction orders,
# and minikv models them as two code paths of `CrossAttentionModule`, each with its own historical / fixed site:
# **eager**, where the layer is built with its quantization config and the backend is created from the
# constructor's argument; and **deferred** (`skip_create_weights_in_init`), where the layer is built before the
# config is known and `create_weights()` must pass it on. Both sites, as unified diffs from the historical to the
# fixed version, generated from the source by `vcs.code_site_diff` (`difflib` over `inspect.getsource`):

# %%
for site in (CrossAttentionModule.__init__, CrossAttentionModule.create_weights):
    print(vcs.code_site_diff(site), end="\n\n")

# %%
mc = fixed.config.model
print(f"{'builder':10s} {'order':9s} {'backend believes':>16s} {'bytes/element':>13s} {'bytes/block':>11s}")
for historical in (True, False):
    builder = CrossBackendBuilder("fp8", fixed.config.dtype, 16, historical=historical)
    for order in ("eager", "deferred"):
        lay = builder.build(order, mc.num_kv_heads, mc.head_size)
        print(f"{'historical' if historical else 'fixed':10s} {order:9s} {lay.describe().split(' ')[0]:>16s} "
              f"{lay.elem_bytes:13d} {lay.block_bytes:11d}")
        assert lay.elem_bytes == (2 if historical else 1)

pool_layout = fixed.arena.layout(cross_names[0])
print(f"\nthe allocator's cross pool layout: {pool_layout.describe()}, {pool_layout.elem_bytes} byte per element, "
      f"{pool_layout.block_bytes} bytes per block")
for fixed_site in B1_SITES:        # a half-fix: one site fixed, the other order still broken
    half = CrossBackendBuilder("fp8", fixed.config.dtype, 16, historical=False,
                               historical_sites=set(B1_SITES) - {fixed_site})
    got = {order: half.build(order, mc.num_kv_heads, mc.head_size).elem_bytes for order in ("eager", "deferred")}
    print(f"only the {fixed_site!r} site fixed: bytes per element, eager {got['eager']}, deferred {got['deferred']}")
    assert sorted(got.values()) == [1, 2]

# %% [markdown]
# The historical layout is 16-bit whichever order is used: a block is 8192 bytes where the pool holds 4096-byte
# blocks (4 heads of 32 per token, K and V, 16 tokens). Block `b` is addressed at `b × 8192` bytes from the pool
# start, twice its real offset, and spans twice as many bytes.
#
# The workload is the six held-out strings of `measure`, submitted together. The one cross block manager, shared
# by all decoder layers, hands out the lowest free block first, so the cross blocks are 0, 1, 2, ... in request
# order, and every cross layer uses the same block table.
#
# The figure stacks three buggy arenas (historical stride, sanitizer off) with cross pools of 1x, 1.5x and 2x the
# blocks needed, on one byte axis. Per arena: the arena itself (three cross pools, then the self-attention pools,
# with a **guard zone**, hatched, after each pool: bytes that belong to no layer, filled with a canary the
# sanitizer checks); one row per cross layer with each block in use where the doubled stride puts it, labelled
# `rN` for its request N; and the requests' self-attention blocks. A block's bytes are green where they land in
# its own pool, dotted where they land in a guard zone (nothing lives there: harmless), and red where they land in
# another layer's **live pool** (they overwrite that layer's data). A self-attention block is outlined red where
# such a write covers it. Each title names the requests whose tokens came out wrong.

# %%
factors = (1.0, 1.5, 2.0)
panels = [cross_stride.byte_arrangement(prompts, reference, f, need) for f in factors]
block_tables = panels[0]["cross_tables"]
for i, (p, t) in enumerate(zip(prompts, block_tables)):
    print(f"request {i}: {len(p):2d} encoder tokens -> cross blocks {ranges(t)}")
assert sorted(b for t in block_tables for b in t) == list(range(need))
assert all(p["cross_tables"] == block_tables for p in panels)
for f, p in zip(factors, panels):
    key = f"b1_wrong_requests_{cross_stride.factor_key(f)}"
    print(f"{f:g}x pool: wrong requests {ranges(p['wrong'])} ({key}: {Q[key]['display']})")
    assert len(p["wrong"]) == Q[key]["value"]
vcs.stride_byte_map(panels)

# %% [markdown]
# Why exactly 2x? With the doubled stride, block `b` ends at `(b + 1) × 8192` bytes into the pool, and a pool of
# `N` blocks ends at `N × 4096`. The block stays inside when `2(b + 1) ≤ N`. The requests use blocks
# `0 … need − 1`, so the highest one stays inside exactly when `N ≥ 2 × need`. The pool then works, but each block
# in use takes two of the pool's blocks, so the memory FP8 was meant to save is spent anyway.
#
# Below 2x the overrun is far from small. The table is `Overrun` facts from `cross_stride.overrun_facts`: per
# cross layer, how far past its pool the highest block in use ends, and which region of the arena holds its last
# byte. Layer 0's blocks run into layer 1's cross pool, layer 1's into layer 2's, and layer 2's into the first
# self-attention pool.

# %%
print(f"{'pool':>5s} {'cross pool':28s} {'bytes past its end':>18s}  last byte lands in")
for f in factors:
    for o in m.overruns[f]:
        print(f"{f:4g}x {o.pool:28s} {o.bytes_past_end:18,d}  {o.lands_in}")
print(f"\nb1_bytes_past_pool_1_5x: {Q['b1_bytes_past_pool_1_5x']['display']}")
print(f"b1_overrun_lands_in_1_5x: {Q['b1_overrun_lands_in_1_5x']['display']}")
assert all(o.bytes_past_end == 0 for o in m.overruns[2.0]) and all(o.bytes_past_end > 4096 for o in m.overruns[1.5])
assert [o.lands_in for o in m.overruns[1.5]] == cross_names[1:] + [self_names[0]]

# %% [markdown]
# In minikv every pool and guard lives inside one arena allocation, and the tail guard is sized for the widest
# element any pool can be addressed with. An overrun can damage canaries and neighbouring pools, but it never
# leaves the allocation. Upstream, on a GPU, a pool below twice the need either crashed the process with an
# illegal memory access or gave silently wrong tokens, when the stray writes hit live data instead.

# %% [markdown]
# ## 3. The overrun, caught and silent
#
# The same buggy engine on the 1.5x pool with the sanitizer on. It compares every guard zone with its canary
# after each step and raises `KVCacheOverrunError`, naming the pool just before the first damaged guard.

# %%
buggy_15x = one_engine(cross_pool_blocks=math.floor(1.5 * need), reintroduce=("cross-stride",),
                       repro=minikv.ReproConfig(check_layout=False))
try:
    serve(buggy_15x, prompts)
    raise AssertionError("the overrun was not caught")
except minikv.KVCacheOverrunError as err:
    # The message also counts the damaged guard bytes; that count is left out here because whether a stray FP8
    # byte happens to equal the guard's fill byte depends on the last bits of float math, which differ per CPU.
    print(f"{type(err).__name__} past pool {err.pool!r}: guard zone bytes [{err.guard_start}, {err.guard_end}) "
          f"of the arena were written")
    overrun = err
failed = overrun.step_output
seen = [e for e in failed.trace.events if e.kind == "cross"]
print(f"raised after the {'context' if failed.is_prefill else 'decode'} step; cross-layer calls in it: {len(seen)}")
assert overrun.pool == cross_names[0] and failed.is_prefill and len(seen) == len(cross_names)
assert not buggy_15x.scheduler.has_unfinished()       # the engine aborted the batch cleanly

# %% [markdown]
# With the sanitizer off (the middle panel of the figure), the engine behaves as upstream did when the overrun
# landed on live memory: no error, and some answers simply wrong. Which ones? Per request, from the real
# addresses of the 1.5x arena: in which cross layers do some of its block's bytes land in a guard zone, in which
# do they land in another layer's live pool, and does such a write cover one of its self-attention blocks?

# %%
silent = panels[1]
into_guard, into_live, live_bytes = {}, {}, []
for name, blocks in silent["doubled"].items():
    layer = name.split(".")[2]
    for start, end, r in blocks:
        for a, b, where in vcs.landing_segments(start, end, name, silent["regions"]):
            if where == "guard":
                into_guard.setdefault(r, set()).add(layer)
            elif where == "live":
                into_live.setdefault(r, set()).add(layer)
                live_bytes.append((a, b))
self_hit = {r for s, e, r in silent["self_blocks"] if any(a < e and s < b for a, b in live_bytes)}
print(f"{'req':>3s} {'cross blocks':12s} {'bytes in a guard zone':22s} {'bytes in a live pool':21s} "
      f"{'self block overwritten':22s} wrong")
for r in range(len(prompts)):
    print(f"{r:3d} {ranges(block_tables[r]):12s} {', '.join(sorted(into_guard.get(r, ()))) or '-':22s} "
          f"{', '.join(sorted(into_live.get(r, ()))) or '-':21s} {str(r in self_hit):22s} {r in silent['wrong']}")
assert sorted(set(into_live) | self_hit) == silent["wrong"]          # a live-pool landing explains every wrong one
guard_only = set(into_guard) - set(into_live) - self_hit                # overhang in guard zones only ...
assert guard_only and not guard_only & set(silent["wrong"])            # ... and every such request comes out right
assert (guard_only, set(into_live), self_hit) == ({4}, {5}, {0, 1, 2, 3})   # what the text below says

# %% [markdown]
# Where the bytes land decides the damage, not whether a block leaves its pool. At 1.5x:
#
# * **Request 4** leaves its pool in every layer, yet comes out right: the part of its last block past the pool
#   lands in the guard zone after it, which holds no layer's data. Nobody else writes there, so request 4 reads
#   back exactly what it wrote (in minikv; the guard is the arena's, sized for the sanitizer).
# * **Request 5**, the highest, lands whole in the next live pool in every layer: cross 0's blocks in cross 1's
#   pool and cross 1's in cross 2's, where those layers' own writes, later in the same step, replace them; cross 2's
#   in the first self-attention pool. Its cross reads then return other layers' data: wrong.
# * **Requests 0-3** leave their pools nowhere, yet go wrong: cross 2's write of request 5 covers their
#   self-attention blocks in layer 0's pool (the lowest blocks, which are theirs).
#
# With the sanitizer off, the defect shows up on other requests than the one that overran, in another layer, and
# only where a landing hits live data: the way an overrun looks from the outside.

# %% [markdown]
# ### The picture story: who writes and reads the arena, and when
#
# The table says *which* requests went wrong; the step trace says *how*. `cross_stride_trace.trace_run` serves
# the six requests on the 1.5x pool one `step()` at a time and replays every write and read of every decoder
# layer, in the order they ran, on a map of the arena's bytes in which each byte remembers who wrote it last
# (which layer, for which request). Writes are placed where each layer's own layout puts them: the historical
# cross backend's layout doubles every address, the self-attention pools are addressed correctly. A write is
# **W!** when some of its bytes land outside the layer's own pool; a read is **R!** when some byte it reads was
# overwritten by another layer since, and the cell names the requests it read for. Rows run top to bottom as the
# layers do within a step (layer 0's self-attention, layer 0's cross-attention, layer 1's, ...).

# %%
from minikv.viz import cross_stride as viz_cross_stride
from minikv.repro import cross_stride_trace

timelines = {}
for buggy_run in (True, False):
    llm = one_engine(cross_pool_blocks=math.floor(1.5 * need), sanitize=False, repro=minikv.ReproConfig(check_layout=False),
                     reintroduce=("cross-stride",) if buggy_run else ())
    timelines[buggy_run], _ = cross_stride_trace.trace_run(
        llm, prompts, reference, title=f"1.5x pool, {'historical' if buggy_run else 'fixed'} stride")
tl = timelines[True]
for layer in tl.layers:
    print(f"{cross_stride_trace.short_name(layer):8s} context step: {' + '.join(tl.events(layer, 'step 0')):18s} "
          f"step 1: {' + '.join(tl.events(layer, 'step 1')):22s} requests hit: {tl.victims.get((layer, 'step 1'), [])}"
          f"  overwritten by: {[cross_stride_trace.short_name(c) for c in tl.culprits.get((layer, 'step 1'), [])]}")
print("requests the byte map says must go wrong:", tl.predicted_wrong(), "| wrong in fact:", tl.wrong)
assert tl.predicted_wrong() == tl.wrong == panels[1]["wrong"]
assert timelines[False].predicted_wrong() == timelines[False].wrong == []
assert all(tl.events(layer, "step 0")[0] == "write stray" for layer in tl.layers if "cross" in layer)
viz_cross_stride.cross_timeline_figure(timelines[True], timelines[False])

# %% [markdown]
# At the context step every cross layer writes its encoder K/V once, and each one's highest blocks land past its
# pool (**W!**): cross 0's in cross 1's pool, cross 1's in cross 2's, cross 2's in the first self-attention pool.
# Within the same step the victims' owners run afterwards and overwrite some of those stray bytes with their own
# (cross 1 covers what cross 0 left in its pool), or, the other way round, the stray write comes after the owner
# wrote: cross 2's lands on the self-attention rows that layer 0 wrote at the start of the step. From the first
# decode step on, every read of those bytes is **R!**: the last request's cross reads (its doubled blocks now hold
# other layers' data) and layer 0's self-attention for the lowest requests (their rows now hold cross 2's K/V).
# The byte map predicts exactly the requests that come out wrong, and none in the fixed engine.
#
# **From the doubled stride to a wrong token.** Request 0 is one of the lowest requests: none of its own cross
# blocks leaves its pool, and it goes wrong anyway. `cross_stride_trace.causal_chain` follows it through a buggy
# and a fixed engine with the same arena: (1) where the doubled stride puts cross 2's blocks, (2) request 0's
# self-attention rows in layer 0's pool after the context step, compared byte for byte with the fixed engine's,
# and (3) the generated tokens of both.

# %%
chain_b = cross_stride_trace.causal_chain(prompts, 1.5, request=0)
print(f"request 0: first overwritten read by {cross_stride_trace.short_name(chain_b.first_overwritten_read[0])} "
      f"at {chain_b.first_overwritten_read[1]}; the stray write came from {cross_stride_trace.short_name(chain_b.culprit)}")
print(f"its {cross_stride_trace.short_name(chain_b.victim_layer)} rows after the context step that differ from the "
      f"fixed engine's (K, V): {[(p, k, v) for p, k, v in chain_b.rows]}")
print(f"generated tokens, fixed: {chain_b.tokens_fixed}")
print(f"generated tokens, buggy: the first equal to the fixed engine's: {chain_b.tokens_buggy[0] == chain_b.tokens_fixed[0]}; "
      f"the second too: {chain_b.tokens_buggy[1:2] == chain_b.tokens_fixed[1:2]}")
assert chain_b.culprit == "decoder.2.cross_attn" and chain_b.victim_layer == "decoder.0.self_attn"
assert all(k and v for _, k, v in chain_b.rows) and chain_b.diverging == 1
assert chain_b.first_overwritten_read == ("decoder.0.self_attn", "step 1")
viz_cross_stride.cross_causal_chain_figure(chain_b)

# %% [markdown]
# The chain, link by link: cross 2 addresses block `b` at twice its offset, so its highest blocks end up past its
# pool. Request 4's last block ends in the guard zone after the pool (harmless: nothing lives there); request 5's
# two blocks land on the first blocks of layer 0's self-attention pool, a live pool, where request 0's rows live. At the context step request 0 has one decoder token (the start token): layer 0 wrote its K and V first
# thing in the step, and cross 2, the last layer to run, wrote over both later in the same step. The first
# generated token comes out of that context step, computed before the overwrite, so it is right; the first decode
# step reads the overwritten rows back, and the second token, and everything after it, goes wrong.

# %% [markdown]
# ### One allocation per pool, and what a GPU bounds checker sees
#
# Upstream's symptom was an illegal memory access on the GPU. minikv keeps every pool in one arena, so the
# overrun above lands in a guard zone and then in the next pool: bytes of the same allocation. A GPU bounds
# checker (`compute-sanitizer --tool memcheck`) sees nothing wrong there, since every byte touched belongs to a
# live allocation. TensorRT-LLM's pool manager allocates each pool on its own; `LLM(repro=ReproConfig(kv_arena="per-pool"))` does
# the same (`minikv.cache.arena.SeparateKVArena`). On CPU each such allocation still carries its own guard after
# the pool, sized for the farthest byte the doubled stride can reach: the Triton interpreter checks no bounds, so
# an exact allocation would make the overrun a segfault or damage whatever the heap holds next. With the guard the
# overrun has no neighbour to damage: caught with the sanitizer on, harmless with it off. `measure` ran both arenas
# at 1.5x:

# %%
print(cross_stride.format_arena_runs(m.arenas, len(prompts)))
assert cross_stride.check_arena_runs(m.arenas) == []

# %% [markdown]
# On a GPU a per-pool allocation is exactly the pool, and the overrun leaves it. The H200 run of
# `tools/memcheck_cross_stride.py` (tiny-t5 in bf16, 3 requests, a cross pool of 1.5x the 3 blocks needed, the
# arena's sanitizer off so that only memcheck looks) is kept in `results/gpu/memcheck/`. Its first run found no
# error in either arena: the CUDA driver had packed the small pools back to back, so one pool's overrun landed in
# the next allocation, which memcheck counts as valid, and the tokens came out silently wrong even with separate
# pools. The second run adds `--padding 1048576` (1 MiB of unallocated memory after every allocation) and shows
# upstream's symptom. From the logs:

# %%
import json  # noqa: E402
from pathlib import Path  # noqa: E402

# The repository's results/ folder, wherever the notebook runs: beside notebooks/, the current folder, or the
# checkout minikv is installed from (a copy of this notebook opened elsewhere).
REPO = next(p for p in (Path(".."), Path("."), Path(minikv.__file__).resolve().parents[1])
            if (p / "results" / "gpu").is_dir())
GPU_LOGS = REPO / "results" / "gpu" / "memcheck"


def memcheck_cases(log: Path) -> dict:
    """{case: [memcheck's error count, the engine's RESULT line, the first error memcheck printed]}."""
    cases, case = {}, None
    lines = log.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("== compute-sanitizer"):
            case = line.rsplit(": ", 1)[1]
            cases[case] = [None, None, None]
        elif case and line.startswith("RESULT "):
            cases[case][1] = json.loads(line[len("RESULT "):])
        elif case and "ERROR SUMMARY:" in line and cases[case][0] is None:
            cases[case][0] = int(line.split("ERROR SUMMARY:")[1].split()[0])
        elif case and "Invalid __global__" in line and cases[case][2] is None:
            report = [lines[j].strip("= ").strip() for j in range(i, i + 5) if "by thread" not in lines[j]]
            cases[case][2] = "\n  ".join(report)
    return cases


runs_logged = {name: memcheck_cases(GPU_LOGS / f"{name}.log") for name in ("no-padding", "padding-1MiB")}
for name, label in (("no-padding", "without padding"), ("padding-1MiB", "with --padding 1048576")):
    print(f"memcheck {label}:")
    for case, (errors, result, first) in runs_logged[name].items():
        outcome = (f"CUDA error: {result['error'][:45]}" if result.get("error") else
                   f"wrong requests {ranges(result['wrong_requests'])}")
        print(f"  {case:27s} {errors:3d} errors   {outcome}")
    print()
print("memcheck's first report, per-pool-historical-1.5x:\n ", runs_logged["padding-1MiB"]["per-pool-historical-1.5x"][2])
errors = {run: {case: v[0] for case, v in cases.items()} for run, cases in runs_logged.items()}
assert errors["no-padding"] == dict.fromkeys(errors["no-padding"], 0)
assert errors["padding-1MiB"]["per-pool-historical-1.5x"] > 0
assert all(n == 0 for case, n in errors["padding-1MiB"].items() if case != "per-pool-historical-1.5x")

# %% [markdown]
# In one arena memcheck reports nothing and two of the three requests come out wrong: silent damage to the
# neighbouring pool. With a pool of its own (and padding after it) the first write past the pool's 16,384 bytes is
# reported, in minikv's cache-write kernel, and the run stops with a CUDA launch failure: upstream's illegal memory
# access. The fixed backend on the same pool, and the historical stride on a pool of twice the blocks needed, stay
# in bounds: no report.

# %% [markdown]
# ## 4. The layout contract: fail at bind time, not at run time
#
# The upstream texts name no check that would catch this class of defect before it damages memory (the fix adds a
# test that pins the quant-config handoff). minikv adds one: when a
# backend is bound to its pool, the pool's `KVLayout` and the backend's must be identical
# (`KVLayout.check_compatible`). With `ReproConfig(check_layout=True)`, the default, the buggy engine cannot even be built.

# %%
print(m.bind_error)
assert "1 byte(s) per element" in m.bind_error and "2 byte(s) per element" in m.bind_error
try:
    one_engine(reintroduce=("cross-stride",))
    raise AssertionError("the layout contract did not fire")
except minikv.KVLayoutMismatchError as err:
    assert str(err) == m.bind_error

# %% [markdown]
# The message names the pool and gives both views of it: 1 byte per element (4096-byte blocks) as allocated,
# 2 bytes per element (8192-byte blocks) as the backend would address it. Any "the allocator and the addresser
# disagree" defect, on any pool, fails the same way.

# %% [markdown]
# ## 5. B2: the fused context path reads FP8 as 16-bit
#
# With B1 fixed, the cross pool is addressed correctly. At the context step the cross layer has two ways to
# attend:
#
# * **fused**: write the K/V into the pool, then run a context kernel that reads them back from the paged cache.
#   It must be told the cache's element format.
# * **unfused**: write the pool, but attend over the 16-bit K/V it still has in its workspace.
#
# Historically the fused kernel learned the FP8 format only when `paged_context` was on. Upstream's fix was the
# **fallback**: use the unfused path for quantized cross attention unless paged context is on (forcing the fused
# FP8 context kernels instead was not possible on sm89, the pull request notes: with 16-bit output they exist
# there only for head size 192), leaving "teach the fused kernel the cache type" as a follow-up. minikv's fused path is always given the cache's real layout (**taught-fused**, the
# default). The code site, historical to fixed:

# %%
print(vcs.code_site_diff(CrossAttentionImpl._context_read_layout))

# %% [markdown]
# What the historical read does to the bytes. Upstream says only that the kernel read the FP8 pool as bf16. minikv
# models that read with the blocks and K/V halves found where the pool put them (its reader takes its block
# offsets from the pool's real bytes per block: minikv's assumption, not an upstream statement), so the first row
# of a block starts at the right byte; but the reader takes 2 bytes per element, so it reads a row of 32 elements
# from 64 bytes: the FP8 row's own 32 bytes make its first half, the next row's bytes the second, and element `j` is
# decoded from bytes `2j` and `2j+1`: two neighbouring FP8 codes glued into one float16. Below, the first K row of cross layer 0 after a fixed
# context step, and what the 16-bit reader makes of it.

# %%
row_engine = one_engine(max_num_seqs=1)
serve(row_engine, prompts[:1])
row_bytes, fp8_values, read_values = cross_stride.fp8_row_read(row_engine, cross_names[0], slot=0, head=0, kv=0)
same = int((read_values == fp8_values).sum())
print(f"elements of the row the 16-bit reader decodes to the FP8 value: {same} of {len(fp8_values)}")
assert same < len(fp8_values) // 4
vcs.fp8_row_as_16bit(row_bytes, fp8_values, read_values, title="Cross layer 0, slot 0, head 0: one FP8 K row")

# %% [markdown]
# `run_context` puts a probe on every cross layer. At each step it compares the layer's output with exact float32
# attention over the K/V the path is meant to read: the FP8 cache's contents (dequantized with the pool's layout)
# for the paged reads, the 16-bit workspace K/V for the unfused path. Against the unquantized K/V, FP8 rounding
# alone would move T5's attention a lot: with no 1/sqrt(d) scaling its scores span over a hundred, and the
# softmax is nearly an argmax. The statistic is `max |out - exact| / max |exact|` over requests and layers.
# The scatter puts every output element of the context step against its exact value.

# %%
by_version = {r.version: r for r in m.ctx_runs}
print(f"{'version':14s} {'context path':13s} {'context step':>13s} {'decode steps':>13s}  wrong requests")
for r in m.ctx_runs:
    print(f"{r.version:14s} {r.path:13s} {cross_stride.error_display(r.context_error):>13s} "
          f"{cross_stride.error_display(r.decode_error):>13s}  {len(r.wrong)} of {len(prompts)}")
print(f"\nb2_context_error (historical, context step): {Q['b2_context_error']['display']}")
print(f"b2_decode_error (historical, decode steps): {Q['b2_decode_error']['display']}")
print(f"b2_wrong_requests: {Q['b2_wrong_requests']['display']}")
hist = by_version["historical"]
assert hist.path == "fused" and hist.context_error > 0.5 and hist.decode_error < 1e-3 and hist.wrong
assert by_version["fallback"].path == "unfused" and by_version["taught-fused"].path == "fused"
for version in ("fallback", "taught-fused"):
    r = by_version[version]
    assert r.context_error < 1e-3 and r.decode_error < 1e-3 and r.tokens_equal_auto
vcs.output_scatter({f"{r.version} ({r.path})": r.samples for r in m.ctx_runs})

# %%
# What the historical fused kernel is told with paged context off (the default): the context step's trace records
# the layout each cross layer's read addressed the pool with.
for paged in (False, True):
    llm = one_engine(reintroduce=("cross-fp8-context-read",), repro=minikv.ReproConfig(paged_context=paged))
    llm.add_request(prompts[0], params_for(prompts[:1])[0])
    context_step = llm.step()
    event = next(e for e in context_step.trace.events if e.kind == "cross" and e.context_path == "fused")
    told = event.read_layout
    if not paged:                   # exercise 2 asks about paged_context=True
        print(f"historical, paged_context={paged!s:5s}: the fused kernel reads the pool as {told.describe()}")
    assert (told == llm.attention_layers[event.layer].layout) == paged

# %% [markdown]
# The historical fused path is wrong at the context step only: its outputs scatter far off the diagonal, by
# several times the largest exact value. Decode steps use the paged decode kernel, which has always been given
# the pool's layout, so their error is 16-bit arithmetic, as in the fixed runs. The one bad step is enough to
# change the generated tokens.
#
# The fallback attends over the 16-bit workspace copy; the taught fused path reads the FP8 pool the way the
# decode kernel does. Both give token ids equal to the `auto` cache. As upstream's, the fallback logs one warning
# per cross-attention layer (the three log lines of `measure` above) and none for a 16-bit cache, and a float32
# model takes the unfused path in every layer (`tests/test_cross_stride.py`).

# %% [markdown]
# ## 6. The fixes, checked
#
# The pool-size grid of `measure`, sanitizer on and off: the buggy engine is "correct" only from 2x up; the fixed
# engine is correct at every size that holds the blocks, including 1.5x, which holds them but is smaller than
# twice the need. That is the regression test upstream's reviewers asked for. Then their second one: the same
# request three times in one batch, and once more on its own.

# %%
cell = {(r.factor, r.buggy, r.sanitize): r for r in m.pool_runs}
print(f"B1: FP8 cross pool as a multiple of the {need} blocks needed")
print(f"{'pool':>6s} {'blocks':>6s} | {'buggy, sanitizer on':20s} {'buggy, sanitizer off':22s} {'fixed':8s}")
for f in (1.0, 1.5, 2.0, 3.0):
    on, off = cell[(f, True, True)], cell[(f, True, False)]
    assert cell[(f, False, True)].outcome == cell[(f, False, False)].outcome == "correct"
    print(f"{f:5.1f}x {on.blocks:6d} | {on.outcome:20s} {off.outcome:22s} correct")
print(f"buggy_safe_pool_factor: {Q['buggy_safe_pool_factor']['display']}")
problems = cross_stride.check_signatures(m.pool_runs, m.bind_error, m.ctx_runs)
assert not problems, problems

fixed6 = one_engine()
fixed_outs = serve(fixed6, prompts)
assert [o.token_ids for o in fixed_outs] == reference and all(TASK.check(p, o.text) for p, o in zip(prompts, fixed_outs))
same_req = [prompts[0]] * 3
together = [o.token_ids for o in fixed6.generate(same_req, params_for(same_req), use_tqdm=False)]
alone = fixed6.generate(prompts[0], params_for([prompts[0]]), use_tqdm=False)[0].token_ids
assert together[0] == together[1] == together[2] == alone == reference[0]
print(f"\nfixed fp8 == auto for all {len(prompts)} requests, every answer right; three identical requests and a "
      f"repeat agree: {fixed6.tokenizer.decode(alone)!r}")
deferred = one_engine(repro=minikv.ReproConfig(cross_construction="deferred"))
assert all(a.impl.layout.elem_bytes == 1 for a in cross_layers(deferred))
print("the deferred construction order gets the fp8 layout too")
print("\nall signatures reproduced")

# %% [markdown]
# **"The first request differs."** Upstream, three identical requests disagreed before the fix, the first one
# differing. Its text does not say which blocks each request got or what lies past the cross pool. In minikv the
# route is visible in the figure: the last request holds the highest cross blocks, so its doubled addresses run
# past the pool first; layer 2's overrun lands on the start of the first self-attention pool, whose lowest
# blocks are the first request's. `measure` ran three copies of one request with the historical stride and the
# sanitizer off, one pool size at a time from 1x to 2x:

# %%
for blocks, factor, differ in m.copies:
    print(f"{blocks:3d} blocks ({factor:.2f}x): copies differing from auto: {', '.join(map(str, differ)) or 'none'}")
print(f"identical_requests_first_copy_differs: {Q['identical_requests_first_copy_differs']['display']}")
assert any(0 in d for _, f, d in m.copies if f < 2) and not any(d for _, f, d in m.copies if f >= 2)

# %% [markdown]
# The first copy differs whenever the overrun reaches the self-attention pool, and never alone: the last copy's
# own stray bytes are overwritten first. Exactly which copy differs is set by the allocation order and the pool's
# neighbours, which upstream's text does not give.

# %% [markdown]
# ## 7. Try it yourself
#
# Three exercises, in the style of Sebastian Raschka's *LLMs from scratch*. Each has three cells: put your answer
# into the first (replace `None`) and run it; the second runs the engine, computes the true answer and says whether
# yours is right, without printing it; the third is the worked solution, folded (in JupyterLab, click the bar left
# of it; on the docs site, click "Solution"). The notebook tests run all three, with no answer filled in.
#
# **Exercise 1: a float32 model's safe pool factor.** The historical backend addresses the pool at the model's
# element size. This notebook ran tiny-t5 in float16 so far, passed explicitly; the model registry's default for
# tiny-t5 on a CPU is float32. Run it in float32 (`dtype=torch.float32`), with pools of 2x, 3x and 4x the blocks
# needed: from which one is the buggy engine safe?

# %% tags=["exercise"]
my_answer_1 = None      # your answer: a pool factor (a number)

# %% tags=["check"]
from minikv.viz.exercises import check

prompts3 = prompts[:3]
ref3 = cross_stride.reference_tokens(prompts3, backend="torch")
need3 = one_engine().cross_blocks_needed(prompts3)


def buggy_float32(factor):
    llm = one_engine(dtype=torch.float32, max_num_seqs=3, cross_pool_blocks=math.floor(factor * need3),
                     reintroduce=("cross-stride",), repro=minikv.ReproConfig(check_layout=False))
    try:
        return "correct" if [o.token_ids for o in serve(llm, prompts3)] == ref3 else "wrong tokens"
    except minikv.KVCacheOverrunError:
        return "overrun caught"
    except FloatingPointError:          # stray float32 bytes that skipped the guard, read as NaN/inf
        return "non-finite logits"


float32_outcomes = {f: buggy_float32(f) for f in (2.0, 3.0, 4.0)}
first_safe = min(f for f, o in float32_outcomes.items() if o == "correct")
check("Exercise 1", my_answer_1, first_safe, rel=1e-9)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution. A float32 model's backend believes in 4-byte elements: block b is addressed at 4x its offset, so the
# pool must hold 4x the blocks in use. Below that, a stray block can even skip a guard zone whole and land in the
# next pool, where the engine's non-finite check stops it. (B2 cannot happen in float32: it always takes the
# unfused context path.) Which failure a too-small pool shows depends on where the stray bytes land, so only
# "correct or not" is printed.
assert first_safe == 4.0 and all(o != "correct" for f, o in float32_outcomes.items() if f < 4.0)
print("answer:", f"{first_safe:g}x;", {f"{f:g}x": "correct" if o == "correct" else "fails"
                                       for f, o in float32_outcomes.items()})

# %% [markdown]
# **Exercise 2: paged context on.** Reintroduce B2 but build the engine with `repro=ReproConfig(paged_context=True)`. How many of the
# six requests come out with token ids different from the `auto` cache?

# %% tags=["exercise"]
my_answer_2 = None      # your answer: a number of requests

# %% tags=["check"]
paged = one_engine(reintroduce=("cross-fp8-context-read",), repro=minikv.ReproConfig(paged_context=True))
paged_wrong = [i for i, (o, r) in enumerate(zip(serve(paged, prompts), reference)) if o.token_ids != r]
check("Exercise 2", my_answer_2, len(paged_wrong))

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution. None: historically the fused kernel was told the cache's type exactly when paged context was on (the
# `if not self.paged_context:` line of the diff in section 5), so only paged context off was affected. The context
# step's trace shows what the historical fused kernel is told with paged context on: the pool's real layout.
paged_step = one_engine(reintroduce=("cross-fp8-context-read",), repro=minikv.ReproConfig(paged_context=True))
paged_step.add_request(prompts[0], params_for(prompts[:1])[0])
event = next(e for e in paged_step.step().trace.events if e.kind == "cross" and e.context_path == "fused")
print(f"historical, paged_context=True : the fused kernel reads the pool as {event.read_layout.describe()}")
assert event.read_layout == paged_step.attention_layers[event.layer].layout
assert paged_wrong == []
print("answer:", len(paged_wrong), "(every token id equals the auto-cache run)")

# %% [markdown]
# **Exercise 3: an outlier in K.** Put one large value, 300, into element 5 of the FP8 K row of section 5 (FP8
# e4m3 reaches 448). The 16-bit reader decodes 32 elements from the row's bytes: which one of them changes?

# %% tags=["exercise"]
my_answer_3 = None      # your answer: an element index

# %% tags=["check"]
outlier_bytes = row_bytes.clone()
outlier_bytes[5] = torch.tensor([300.0]).to(torch.float8_e4m3fn).view(torch.uint8)[0]
outlier_read = outlier_bytes.view(torch.float16).float()
changed = [j for j in range(len(outlier_read)) if not torch.equal(outlier_read[j], read_values[j])]
assert len(changed) == 1
check("Exercise 3", my_answer_3, changed[0])

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution. 300 rounds to 288 in e4m3, code 0x79 (sign 0, exponent 1111, mantissa 001). Byte 5 is the high byte
# of 16-bit element 2 (little-endian: bytes 4 and 5), so element 2 changes, and only it. Read as the top of a
# float16, 0x79 gives the exponent field 11110: element 2 becomes 2^15 times something between 1 and 2, about
# a hundred times the largest FP8 value. Any FP8 outlier of 256 or more does this; above 384 (exponent field
# 11111 in float16) it decodes as inf or NaN, and the softmax over such a key breaks down.
big = outlier_read[2].abs().item()
assert changed == [2] and int(outlier_bytes[5]) == 0x79 and 2**15 <= big < 2**16
print("answer:", changed[0], f"(code 0x{int(outlier_bytes[5]):02x}; 2^15 <= |value| < 2^16: {2**15 <= big < 2**16})")

# %% [markdown]
# ## Summary
#
# * **B1.** The cross backend was built without the quantization config, so it addressed a 1-byte pool with a
#   2-byte stride. That works when the pool holds at least twice the blocks in use, and overruns otherwise: into
#   the next cross pool, and from the last cross layer into the self-attention pool. The fix passes the config in
#   both construction orders (a half-fix leaves the other order broken). The layout contract, beyond upstream,
#   rejects the mismatch when the backend is bound; the arena's guard canaries catch an overrun within the step.
#   Where an overrun's bytes land decides the damage: in a guard zone nothing (request 4 at 1.5x), in a live pool
#   the data of another layer, and through it other requests (0-3, whose self-attention rows cross 2 covers).
# * **B2.** The fused context kernel found the right blocks of the FP8 cross pool but read their bytes as 16-bit
#   elements unless paged context was on. Upstream falls back to the unfused path; minikv tells the fused kernel
#   the real layout. Both give token ids equal to the `auto` cache.
#
# The same checks run from the command line with `minikv repro cross-stride --results results/cross_stride.json`,
# which writes the numbers printed above.
#
# Next: [notebook 05](05_gpu_performance.ipynb), the kernels on a GPU. Docs:
# [Encoder-decoder cross attention](../docs/concepts/cross-attention.md),
# [Defect B](../docs/defects/cross-stride-fp8-context.md), [glossary](../docs/glossary.md).
