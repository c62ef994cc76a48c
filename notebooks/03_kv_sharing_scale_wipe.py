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
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · KV sharing and the scale wipe
#
# This notebook takes apart a defect in vLLM's Triton attention backend, as a vLLM pull request describes it: with
# an int8 or fp8 *per-token-head* KV cache, a model whose last layers share earlier layers' KV caches (the Gemma 4
# family) answered the first `max_num_seqs` requests an engine ever served wrongly, and every later request
# correctly. (Words such as [paged](../docs/glossary.md#page-paged), [slot mapping](../docs/glossary.md#slot-mapping)
# or [storage and view](../docs/glossary.md#storage-and-view) are in the [glossary](../docs/glossary.md).)
# vLLM pull request [#51061](https://github.com/vllm-project/vllm/pull/51061) described it, proposed a fix and
# called it the likely root cause of issues [#50702](https://github.com/vllm-project/vllm/issues/50702) and
# [#50749](https://github.com/vllm-project/vllm/issues/50749); it was closed, and its successor
# [#51091](https://github.com/vllm-project/vllm/pull/51091), with the same fix, says the wipe is real but not the
# primary failure those issues report. The box under the first code cell has the dated steps and their states;
# the docs page [Defect A: the scale wipe](../docs/defects/scale-wipe.md) is the short version.
#
# No single line of the old code is wrong on its own. The defect is where three reasonable ideas meet:
#
# 1. **KV sharing.** A sharing layer has no K/V projections; it attends over the cache of an earlier layer, and
#    the engine hands it *the same tensor object*.
# 2. **Inline scales need a one-time fill.** Each cache row carries its own fp32 scale. A new cache is all zero
#    bytes, so its scale slots must be set to 1.0 once, and the old code did that lazily, the first time each
#    *attention impl* touched its cache.
# 3. **Warmup does not touch the sharing layers.** Upstream's description says only that warmup "didn't exercise"
#    them. minikv models that with a dummy forward at start-up that has no attention metadata: owning layers still
#    run their cache update (writing nothing) and so do their one-time fill, while sharing layers do nothing. Their
#    first touch comes in the middle of the first real forward pass.
#
# Put together, a sharing layer's "one-time" fill lands on a storage its target layer has just filled with the
# prompt's real scales, and resets them to 1.0. We go through each idea with minikv's code as evidence, reproduce
# the damage, follow it step by step from the wiped scales to a wrong token, count every fill, and then check the
# fix. Section 10 has exercises.
#
# Everything runs on CPU. The defect lives in how the attention impl sets up its scale views, not in any kernel,
# so the bulk of the runs use minikv's `torch` backend (the pure-PyTorch references of the Triton kernels, with
# the same byte addressing); the Triton interpreter is slow on CPU. One cell in section 4 reruns the first batch
# on the `triton` backend and checks it gives the same tokens.

# %%
# %matplotlib inline
import inspect

import torch

import minikv
from minikv import viz
from minikv.defects import provenance
from minikv.viz import scale_wipe as viz_scale_wipe
from minikv.attention.impl import AttentionImpl, ScaleFillCensus
from minikv.repro import scale_wipe, scale_wipe_trace
from minikv.repro.common import dequantized_rows, ranges, stored_scales

torch.manual_seed(0)
torch.set_num_threads(1)   # the tiny model's ops are too small to gain from threads on a CPU
DEVICE = "cpu"
BACKEND = "torch"          # the bulk runs; see the note above
FORMAT = "int8_per_token_head"
BLOCK_SIZE = 16            # the engines' default block size
MODEL = scale_wipe.MODEL   # "tiny-gemma4"
task = minikv.tasks.for_model(MODEL)


def engine(buggy=False, **kw):
    """A tiny-gemma4 engine on CPU; `buggy=True` reintroduces the historical scale-view setup."""
    kw = {"kv_cache_dtype": FORMAT, "max_num_seqs": 4, "device": DEVICE, "backend": BACKEND, **kw}
    return minikv.LLM(model=MODEL, reintroduce=("scale-wipe",) if buggy else (), **kw)


provenance.show("scale-wipe")    # what upstream said, and when (minikv/defects/provenance.py)
print(minikv.bugs.DEFECTS["scale-wipe"].summary)
print("code site:", minikv.bugs.DEFECTS["scale-wipe"].code_site)

# %% [markdown]
# ## 1. KV sharing: two sharers per storage, one tensor
#
# `tiny-gemma4` is a Gemma-4 text decoder (minikv's implementation, checked against transformers) with eight
# layers that alternate sliding-window and full attention. Its config says `num_kv_shared_layers = 4`: the last
# four layers compute no K/V of their own, and each reads the cache of the last earlier layer of its own type, as
# transformers derives it. So layers 4 and 6 (sliding) read layer 2's cache, and layers 5 and 7 (full) read layer
# 3's: **two sharers per storage**, as in gemma-4-E2B, where many layers share each of two storages. The model
# runner allocates one pool per *owning* layer in the KV arena and then binds caches: an owning layer gets its
# pool, a sharing layer gets its target's cache, the very same Python object.
#
# We build the fixed engine now (it also serves the reproduction in section 4).

# %%
fixed = engine()
layers = fixed.attention_layers                             # name -> the model's attention op, as the engine bound it
self_layers = [a for a in layers.values() if a.kind == "self"]
print("layer types:", [t.split("_")[0] for t in fixed.model_config.layer_types])
print("kv_sharing:", fixed.model_config.kv_sharing)
print("pools in the arena:", list(fixed.arena.specs))
print()
print(f"{'layer':26s} {'k/v projections':>15s}  {'reads the cache of':26s} {'kv_cache is the owner':>22s}")
for block, a in zip(fixed.model.model.layers, self_layers):
    owner = layers[a.kv_sharing_target] if a.kv_sharing_target else a
    print(f"{a.layer_name:26s} {hasattr(block.self_attn, 'k_proj') and hasattr(block.self_attn, 'v_proj')!s:>15s}  "
          f"{owner.layer_name:26s} {a.kv_cache is owner.kv_cache!s:>22s}")
impls = {id(a.impl) for a in self_layers}
print(f"\n{len(self_layers)} layers, {len(impls)} distinct attention impls, "
      f"{len({id(a.kv_cache) for a in self_layers})} distinct cache tensors")

layer2, layer4, layer6 = (layers[f"model.layers.{i}.self_attn"] for i in (2, 4, 6))
assert layer4.kv_cache is layer2.kv_cache and layer6.kv_cache is layer2.kv_cache   # the same object, twice
assert len({id(layer2.impl), id(layer4.impl), id(layer6.impl)}) == 3                # ...reached through three impls
assert len(fixed.arena.specs) == 4                                                  # four pools for eight layers

# %% [markdown]
# Each layer still has its **own attention impl**, and the impl is where per-layer state lives. That is the
# trap: anything an impl does "the first time it sees its cache" happens once per impl, so three times for a
# storage that an owner and two sharers use, each time at whatever moment that layer first runs. A sharing layer
# never writes K/V, so a per-impl action that changes the cache's bytes is suspect: it changes bytes that belong
# to another layer.

# %% [markdown]
# ## 2. Per-token-head quantization and inline scales
#
# In the per-token-head formats, each head vector `x` of each token is stored as `head_size` one-byte codes
# plus its own fp32 scale, `scale = max(amax(|x|) / QMAX, eps)` and `code = round(x / scale)` (QMAX 127 for
# int8, 448 for [fp8](../docs/glossary.md#fp8) e4m3). The scale sits right after the codes in the same row, so a
# row of `tiny-gemma4` (head size 32) is 36 bytes. [Notebook 02](02_quantized_kv_cache.ipynb) draws the row, slot
# and block layout; here we only need the numbers.

# %%
layout = fixed.kv_layout
print(layout.describe())
print(f"row: {layout.head_size} codes x {layout.elem_bytes} byte + 4-byte scale at byte {layout.scale_offset} "
      f"= {layout.row_bytes} bytes; slot: {layout.num_kv_heads} rows = {layout.slot_bytes} bytes; "
      f"block: K then V, {layout.block_bytes} bytes")

# %% [markdown]
# A pool is allocated zero-filled, which makes every scale 0.0. The engine's rule is that a scale reads 1.0
# until a real one is written, so somebody has to write 1.0 into every scale slot once. Let's do by hand what
# the engine does, on a one-block pool: allocate, fill the scales, then write one token with the cache-write op.

# %%
ops = fixed.kernel_ops
pool = torch.zeros(1, layout.block_bytes, dtype=torch.uint8)      # as allocated: every byte 0
k_scales, v_scales = layout.scale_views(pool)                     # fp32 views over the same bytes
print("scale views:", tuple(k_scales.shape), "(blocks, slots, kv heads); fresh values:",
      sorted(set(k_scales.flatten().tolist())))
k_scales.fill_(1.0)
v_scales.fill_(1.0)                                               # the one-time initialization

gen = torch.Generator().manual_seed(0)
# Rounded to bfloat16 precision: torch.randn's last bits differ between CPU instruction sets, and the bytes printed
# below should be the same on every machine.
key = (torch.randn(1, layout.num_kv_heads, layout.head_size, generator=gen) * 0.4).to(torch.bfloat16).float()
ops.write_kv(key, key.clone(), pool, torch.tensor([0]), layout, 1.0, 1.0)

start = layout.row_offset(block=0, kv=0, slot_in_block=0, head=0)
row = pool.view(-1)[start:start + layout.row_bytes]
codes, scale_bytes = row[:layout.scale_offset].view(torch.int8), row[layout.scale_offset:]
scale = scale_bytes.view(torch.float32)
print("K row of token 0, head 0:")
print("  codes  :", codes.tolist())
print("  scale  : bytes", scale_bytes.tolist(), "-> fp32", f"{scale.item():.6f}")
print(f"  amax/127 = {key[0, 0].abs().max().item() / 127:.6f}")
print("  slot 1 (not written) K scales:", k_scales[0, 1].tolist())
assert torch.isclose(scale, key[0, 0].abs().max() / 127).all()
assert torch.equal(codes, torch.round(key[0, 0] / scale).to(torch.int8))
assert torch.allclose(codes.float() * scale, key[0, 0], atol=scale.item() / 2 + 1e-7)

# %% [markdown]
# The bytes of the scale and the bytes of the codes are separate: an fp32 view over the scale slots can rewrite
# every scale in the pool without touching one code. That is what the defect does.
#
# The question is *when* the one-time fill happens. The attention impl reaches the scales through
# `scale_views(kv_cache)`, which dispatches to one of two versions that sit side by side in
# `minikv/attention/impl.py`. Here they are as a unified diff, made from the code itself
# (`difflib` over `inspect.getsource`): `-` lines are the historical version, `+` lines the fix.
#
# * **HISTORICAL.** The fill happens on the first touch **by this impl**; from then on the impl returns early for
#   good, as upstream's `_ensure_scale_caches` does. Nothing asks whether another impl already wrote there.
# * **FIX.** The fill happens once **per storage**, whichever impl touches it first. A class-level registry is
#   keyed by (first byte's address, size in bytes), and each entry holds a weak reference to the storage itself
#   (`tensor.untyped_storage()`, not one tensor viewing it): two views of one storage count once, two pools
#   packed in one allocation are two entries, and a new allocation that lands at a freed storage's address no
#   longer matches the dead reference and is filled again.

# %%
print(scale_wipe.code_site_diff())

# %% [markdown]
# ## 3. Warmup: who touches the cache first
#
# At start-up minikv's runner runs one dummy forward with **no attention metadata**. This is minikv's model of a
# warmup that leaves the sharing layers alone (upstream's text does not say what shape its warmup had). The
# impl's forward has a branch for that case: an owning layer runs its cache update with every slot set to -1
# (nothing is written, but `write_cache` calls `scale_views`, so the owning impl does its fill), and a sharing
# layer returns at once.

# %%
source = inspect.getsource(AttentionImpl.forward).splitlines()
first = next(i for i, line in enumerate(source) if "if md is None" in line)
print("\n".join(source[first:first + 8]))

# %% [markdown]
# Every fill is logged in the engine's `ScaleFillCensus`: which layer filled, at which engine step (-1 is the
# warmup), and how many *written* scales (neither 0.0 nor 1.0) it overwrote. Right after construction, the fixed
# engine and a buggy one look the same: the four owning layers filled their own fresh storage during warmup,
# wiping nothing, and the four sharing layers' impls have not touched anything yet.

# %%
buggy = engine(buggy=True)


def show_census(llm, label, since=0):
    """The census of `llm` from its fill number `since` on: a summary line, then one line per fill."""
    fills = llm.census.fills[since:]
    print(f"{label}: {ScaleFillCensus(fills).summary()}")
    for f in fills:
        print(f"  {f.layer:26s} step {f.step:2d}  overwrote {f.overwritten:6,} written scales")


def impls_with_views(llm):
    return [n for n, a in llm.attention_layers.items() if a.impl.has_scale_views]


for label, llm in (("fixed", fixed), ("buggy", buggy)):
    show_census(llm, label)
    print("  impls holding scale views:", impls_with_views(llm))

owners = [a.layer_name for a in self_layers if a.kv_sharing_target is None]
for llm in (fixed, buggy):
    assert [f.layer for f in llm.census.fills] == owners
    assert all(f.step == -1 and f.overwritten == 0 for f in llm.census.fills)
    assert impls_with_views(llm) == owners

# %% [markdown]
# In the fixed engine, the sharing layers' first touch will find their storage in the registry and fill
# nothing. In the buggy engine, each of them will fill during step 0: layer 4 right after layer 2 has quantized
# the prompt into their shared storage, layer 6 after layer 4 has already reset it.
#
# ## 4. The reproduction
#
# Upstream reproduced it on gemma-4-E2B-it with 48 arithmetic-continuation prompts, each submitted 4 times,
# greedy: the first `max_num_seqs` requests came out wrong in every run. `tiny-gemma4` was trained on the same
# kind of task, for any window of a sequence (continue `"250 263 276"` with `" 289 302 315 ..."`), so every
# answer is objectively right or wrong. We use the same structure at CPU size: 12 prompts x 2 copies = 24
# requests, greedy, 12 new tokens, `max_num_seqs=4`. Requests 0-11 are the distinct prompts and requests 12-23
# their copies, in the same order.
#
# A request counts as **damaged** when the buggy engine's answer is wrong by the task's check *and* differs from
# the fixed engine's answer. We drive each engine one `step()` at a time (`serve` below), and right after step 0
# read the K/V of the first batch back from the pools of layers 2 and 3 (the shared storages): codes, scales, and
# the dequantized values the kernels will read. The order from here: what went wrong (this section), when the
# scales were reset (section 5), how that turns into a wrong token (section 6), then the full count of every
# fill (section 7) and which later requests the damage can reach (section 8).

# %%
prompts = scale_wipe.make_prompts(24, copies=2)
params = minikv.SamplingParams(temperature=0, max_tokens=12)
TARGETS = ("model.layers.2.self_attn", "model.layers.3.self_attn")


def code_rows(layout, pool, slots):
    k_codes, v_codes = layout.code_views(pool)
    idx = torch.tensor(slots)
    blocks, offsets = idx // layout.block_size, idx % layout.block_size
    return k_codes[blocks, offsets].clone(), v_codes[blocks, offsets].clone()


def serve(llm, prompt_list, params, after_step=lambda out: None):
    """add_request for every prompt, then step until all finish; `after_step` sees each StepOutput."""
    ids = [llm.add_request(p, params) for p in prompt_list]
    done = {}
    while llm.has_unfinished():
        out = llm.step()
        after_step(out)
        done.update({o.request_id: o for o in out.finished})
    return [done[i] for i in ids]


def first_step_probe(llm, store):
    """After the engine's first step, read the first batch's rows back from the shared storages."""
    def probe(out):
        if out.step != 0:
            return
        slots = [s for r in out.request_ids for s in out.block_slots(r, BLOCK_SIZE)]
        store["requests"] = list(out.request_ids)
        store["lengths"] = [out.seq_lens[r] for r in out.request_ids]
        store["slots"] = slots
        for name in TARGETS:
            pool, layout_ = llm.arena.pool(f"kv.{name}"), llm.arena.layout(f"kv.{name}")
            k, v = dequantized_rows(layout_, pool, slots)
            ks, vs = stored_scales(layout_, pool, slots)
            kc, vc = code_rows(layout_, pool, slots)
            store[name] = {"k": k, "v": v, "k_scale": ks, "v_scale": vs, "k_code": kc, "v_code": vc}
    return probe


probe_fixed, probe_buggy = {}, {}
outs_fixed = serve(fixed, prompts, params, first_step_probe(fixed, probe_fixed))
outs_buggy = serve(buggy, prompts, params, first_step_probe(buggy, probe_buggy))
texts_fixed, texts_buggy = [o.text for o in outs_fixed], [o.text for o in outs_buggy]
right_fixed = [task.check(p, t) for p, t in zip(prompts, texts_fixed)]
right_buggy = [task.check(p, t) for p, t in zip(prompts, texts_buggy)]
damaged = [i for i in range(len(prompts)) if texts_buggy[i] != texts_fixed[i] and not right_buggy[i]]

print(f"{'req':>3s} {'batch':>5s}  {'prompt (last 22 chars)':24s} {'fixed engine':18s} {'buggy engine':18s}")
for i, p in enumerate(prompts):
    mark = "DAMAGED" if i in damaged else ""
    print(f"{i:3d} {i // 4:5d}  {p[-22:]:>24s} {texts_fixed[i]!r:18s} {texts_buggy[i]!r:18s} {mark}")
print(f"\nfirst batch: requests {probe_buggy['requests']}; damaged: {ranges(damaged)}; "
      f"fixed engine wrong: {ranges([i for i, ok in enumerate(right_fixed) if not ok])}")

assert probe_buggy["requests"] == probe_fixed["requests"] == [0, 1, 2, 3]
assert damaged == [0, 1, 2, 3]                         # the whole first batch, and only it
assert all(right_fixed)
assert texts_buggy[4:] == texts_fixed[4:]              # later batches untouched
assert prompts[0] == prompts[12] and not right_buggy[0] and right_buggy[12]

# %% [markdown]
# Request 0 and request 12 carry the same prompt; only the one that happened to be scheduled first is wrong.
#
# What did the buggy engine change in memory? After step 0, the first batch's int8 codes in the shared storages
# are byte-identical in the two engines; only the scales differ, and in the buggy engine every one of them is 1.0:
# they were **wiped**.

# %%
for name in TARGETS:
    f, b = probe_fixed[name], probe_buggy[name]
    assert torch.equal(f["k_code"], b["k_code"]) and torch.equal(f["v_code"], b["v_code"])
    assert bool((b["k_scale"] == 1).all()) and bool((b["v_scale"] == 1).all())
    print(f"{name}: codes identical; true K scales {f['k_scale'].min():.3f}..{f['k_scale'].max():.3f}, "
          "buggy engine's: all 1.0")

# %% [markdown]
# The same first batch on the `triton` backend (the Triton kernels, run by the interpreter): the buggy engine
# gives the same first 3 tokens as the torch backend above, and the fixed engine too, and the census logs the same
# late fills. (Three tokens are not enough to show all the damage: some damaged requests still start right.)
# To keep the interpreter's time down, only the first batch runs, for 3 new tokens, compared with the first 3
# tokens of the runs above.

# %%
for buggy_run, reference_outs in ((False, outs_fixed), (True, outs_buggy)):
    llm = engine(buggy=buggy_run, backend="triton")
    got = llm.generate(prompts[:4], minikv.SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    print(f"triton backend, {'buggy' if buggy_run else 'fixed'}: {[o.text for o in got]}; late fills: "
          f"{[(f.layer, f.overwritten) for f in llm.census.fills if f.step >= 0]}")
    assert [o.token_ids for o in got] == [o.token_ids[:3] for o in reference_outs[:4]]
    assert [(f.layer, f.overwritten) for f in llm.census.fills] == (
        [(f.layer, f.overwritten) for f in buggy.census.fills] if buggy_run else
        [(f.layer, f.overwritten) for f in fixed.census.fills[:4]])
del llm

# %% [markdown]
# ## 5. The timeline: who touches the shared storages, and when
#
# The table says *which* requests went wrong; the engine's step trace says *when* the scales were reset, and by
# which layer. `scale_wipe_trace.trace_run` drives an engine with `step()` and reads each step's `StepTrace`: one
# event per layer (which pool it wrote, which it read) and the scale fills of that step. Wiped rows are followed
# from the engine's record of fills (the census of section 3): a wiping fill keeps the scales it overwrote, so we
# know which slots it wiped, and a slot stays wiped until its owner writes a new token there. Eight requests, 4 new tokens each: steps 0-3 are the first batch
# (a prefill, then decode steps), steps 4-7 the second. Within a step, a layer runs after the ones above it.
#
# How to read it: **W** the layer wrote its own pool, **F** it filled the storage's scales with 1.0 (wiping
# nothing), **F!** it filled them after real scales were written (the wipe), **R** its attention read K/V with
# their own scales, **R!** it read rows whose scales were wiped. Red is wrong.

# %%
timeline_buggy, _ = scale_wipe_trace.trace_run(engine(buggy=True), prompts[:8], max_tokens=4)
timeline_fixed, _ = scale_wipe_trace.trace_run(engine(), prompts[:8], max_tokens=4)
for t in (timeline_buggy, timeline_fixed):
    print(f"{'buggy' if t.buggy else 'fixed'} engine, step 0:",
          {layer: "+".join(t.events(layer, "step 0")) for layer in range(t.num_layers)})
assert timeline_buggy.events(4, "step 0") == ["wipe", "read wiped"]
assert timeline_buggy.events(6, "step 0") == ["fill", "read wiped"]
assert timeline_buggy.events(2, "step 0") == ["write", "read"]
assert timeline_fixed.reads_wiped() == {}
viz_scale_wipe.timeline_figure(timeline_buggy, timeline_fixed)

# %% [markdown]
# Step 0 in the buggy engine, top to bottom: layers 0-3 write the prompt's K/V with real scales and attend over
# them correctly (green). Then layer 4 touches layer 2's storage for the first time and wipes it (**F!**), and
# reads the wiped rows; layer 5 does the same to layer 3's; layers 6 and 7 fill again, harmlessly, and read wiped
# rows too. From step 1 on it is not only the sharers: **layers 2 and 3 read their own storage at every decode
# step, and it now holds the wiped prompt rows**, so they are wrong as well. Layers 0 and 1 own unshared pools and
# stay right. The second batch (steps 4-7) writes fresh rows with real scales: no fill happens again, and
# everything is green. In the fixed engine no sharer ever fills.
#
# Over a whole run of the 24 requests, the same trace shows which layers read wiped rows at which steps: only
# during the first batch's 12 steps.

# %%
timeline_full, outs_full = scale_wipe_trace.trace_run(engine(buggy=True), prompts, max_tokens=12)
reads_wiped = timeline_full.reads_wiped()
for layer, columns in reads_wiped.items():
    print(f"layer {layer} read wiped rows at steps {ranges(int(c.split()[1]) for c in columns)}")
assert [o.text for o in outs_full] == texts_buggy
assert sorted(reads_wiped) == [2, 3, 4, 5, 6, 7]
assert all(c in {f"step {s}" for s in range(12)} for cs in reads_wiped.values() for c in cs)
viz_scale_wipe.wiped_reads_figure(timeline_full)

# %% [markdown]
# ## 6. From a wiped scale to a wrong token
#
# The chain has four links: the wipe (above: the first batch's scales reset to 1.0, the codes intact), K and V
# inflated, the attention collapsing onto one key, and a wrong token.
#
# **Inflated K and V: exactly 1 / true scale.** A wiped row dequantizes as `code x 1.0` instead of `code x scale`, so every K and
# V vector of the first batch's prompt is blown up by exactly `1 / scale` of its own row. The check below compares,
# for every (token, kv head) row of both shared storages, the measured ratio of norms with `1 / true scale`.
# Upstream measured K inflated x221 and V x24 on Gemma 4; `tiny-gemma4`'s factors differ because its true scales
# do, but the same law holds for every row.

# %%
for name in TARGETS:
    f, b = probe_fixed[name], probe_buggy[name]
    for part in ("k", "v"):
        norm_f, norm_b = f[part].norm(dim=-1), b[part].norm(dim=-1)
        live = norm_f > 0
        residual = ((norm_b[live] / norm_f[live]) * f[f"{part}_scale"][live] - 1).abs().max().item()
        assert residual < 1e-4, (name, part, residual)
print("every row: |K_buggy| / |K_fixed| and |V_buggy| / |V_fixed| equal 1 / true scale within a relative 1e-4")
assert all(bool((probe_buggy[n]["k"].abs().amax(dim=-1) == 127).all()) for n in TARGETS)
print("what is left in the buggy engine is the codes themselves: max |K| of every row is 127, the int8 limit")

# %% [markdown]
# **The scales, before and after.** The engine's record of fills keeps a snapshot of what each late fill overwrote. For layer 2's
# storage, the left panel is that snapshot (the scales layer 2 wrote for the first batch, captured inside layer
# 4's fill) and the right panel is what the pool holds after step 0. The snapshot equals, bit for bit, what the
# fixed engine stores in the same slots.

# %%
sharing = {n: a.kv_sharing_target for n, a in buggy.attention_layers.items() if a.kv_sharing_target}
wipe_of_layer2 = next(f for f in buggy.census.wiping if sharing[f.layer] == "model.layers.2.self_attn")
idx = torch.tensor(probe_buggy["slots"])
blocks, offsets = idx // layout.block_size, idx % layout.block_size
before = wipe_of_layer2.wiped_k_scales[blocks, offsets]
after = probe_buggy["model.layers.2.self_attn"]["k_scale"]
assert torch.equal(before, probe_fixed["model.layers.2.self_attn"]["k_scale"])
assert bool((after == 1).all())
viz.scale_heatmap(before, after, title="Layer 2's storage: K scales of the first batch's prompt tokens",
                  labels=("written by layer 2 (census snapshot)", "after layer 4's late fill"))

# %% [markdown]
# **The damage across configurations.** `minikv repro scale-wipe` runs a buggy and a fixed engine per configuration and checks upstream's signatures.
# Here are its functions on a small set: both per-token-head formats, `max_num_seqs` 4 and 8, prefix caching off,
# the same 24 requests, plus a float32 (`auto`) cache with and without the switch. "K infl" and "V infl" are the
# median inflation per (token, kv head) row; the last column counts the scale fills (section 7 takes them apart:
# fills that wiped nothing | late fills and how many written scales each overwrote).

# %%
pairs = []
for fmt in scale_wipe.FORMATS:
    for seqs in (4, 8):
        fixed_run = scale_wipe.run_engine(fmt, seqs, False, False, prompts, backend=BACKEND)
        buggy_run = scale_wipe.run_engine(fmt, seqs, False, True, prompts, backend=BACKEND)
        scale_wipe.compare(fixed_run, buggy_run)
        pairs.append((fixed_run, buggy_run))
clean16 = (scale_wipe.run_engine("auto", 4, False, False, prompts, backend=BACKEND),
           scale_wipe.run_engine("auto", 4, False, True, prompts, backend=BACKEND))
print(scale_wipe.format_table(pairs, clean16))
problems = scale_wipe.check_signatures(pairs, clean16)
print("signatures not reproduced:", problems or "none")
assert problems == []

# %% [markdown]
# Every signature upstream reported holds: the damaged requests are exactly the first batch (0-3 with
# `max_num_seqs=4`, 0-7 with 8); the int8 per-token-head cache is hit and a cache without inline scales is
# untouched by the switch (upstream's evidence: int8 only, bf16 clean); the inflation equals 1 / true scale; and
# there is one late wiping fill per shared storage, as upstream reports two. minikv also runs
# `fp8_per_token_head`, which upstream's description names among the affected formats but for which it reports no
# measurement: it is hit the same way.
#
# **One number per quantity.** The figures the README and the docs quote come from one computation,
# `scale_wipe.quantities`, on the `int8_per_token_head`, `max_num_seqs=4` pair; `minikv repro scale-wipe
# --results results/scale_wipe.json` writes the same ones to the results file. Each names its statistic:

# %%
quantities = scale_wipe.quantities(pairs)
print(scale_wipe.format_quantities(pairs))
_, headline = scale_wipe.headline_pair(pairs)
assert quantities["inflation_vs_true_scale"]["display"] == "< 1e-4"
assert quantities["damaged_requests"]["display"] == "0-3" and quantities["wiping_fills"]["display"] == "2"
print("\nnext to upstream (gemma-4-E2B-it):")
for name, ours, theirs in scale_wipe.upstream_rows(pairs):
    print(f"  {name:42s} minikv {ours:16s} upstream {theirs}")

# %% [markdown]
# **From a wiped scale to a wrong token.** One request, four panels (`scale_wipe_trace.causal_chain`):
#
# 1. the largest |K| of each of request 0's prompt tokens in layer 2's storage, fixed engine vs buggy;
# 2. the attention weights of one query head of layer 4 at the first decode step, over those keys. The query is
#    the fixed engine's in both cases, so only the keys differ. Over the right keys the weight spreads over many
#    tokens; over the inflated keys every score is multiplied by its key's inflation, and the softmax collapses
#    onto one key (the assert below checks that it carries more than nine tenths of the weight);
# 3. the generated tokens of both engines, side by side: they agree for the first few tokens, although every step
#    reads the wiped keys, because the inflated scores have not yet changed which token wins;
# 4. the top logits at the first token where the two engines part.

# %%
chain = scale_wipe_trace.causal_chain(prompts, request=0, layer=4, head=0)
print(f"request 0 {prompts[0]!r}")
print(f"  fixed engine: {chain.text_fixed!r}\n  buggy engine: {chain.text_buggy!r}")
print(f"  they part at generated token {chain.diverging_step}: fixed {chain.chosen_fixed!r}, "
      f"buggy {chain.chosen_buggy!r}")
assert chain.text_fixed == texts_fixed[0] and chain.text_buggy == texts_buggy[0]
assert chain.chosen_fixed != chain.chosen_buggy
assert float(chain.attn_buggy.max()) > 0.9 > float(chain.attn_fixed.max())   # collapsed onto one key
viz_scale_wipe.causal_chain_figure(chain, quantities["k_inflation"]["display"])

# %% [markdown]
# ## 7. The census: which fill wiped what
#
# **The census.** The buggy engine's census, fill by fill: the four warmup fills of the owners, then, at step 0,
# one fill by each of the four sharing layers. Every K and V scale of the first batch's prompt tokens in a shared
# storage was overwritten by the first sharer that touched it: 2 (K and V) x 2 kv heads x the batch's token count.

# %%
show_census(buggy, "buggy")
show_census(fixed, "fixed")
batch_tokens = sum(probe_buggy["lengths"])
print(f"first batch: {batch_tokens} prompt tokens -> 2 x {layout.num_kv_heads} x {batch_tokens} = "
      f"{2 * layout.num_kv_heads * batch_tokens:,} scales per shared storage")

late = [f for f in buggy.census.fills if f.step >= 0]
sharing = {n: a.kv_sharing_target for n, a in buggy.attention_layers.items() if a.kv_sharing_target}
assert [f.layer for f in late] == list(sharing) and all(f.step == 0 for f in late)
assert [f.overwritten for f in late] == [2 * layout.num_kv_heads * batch_tokens] * 2 + [0, 0]
assert not fixed.census.wiping and len(fixed.census.fills) == 4

# %% [markdown]
# Grouped by storage: per shared storage, **one late fill that wipes** the written scales (the first sharing layer
# to touch it: layer 4 for layer 2's storage, layer 5 for layer 3's) and **harmless late fills** from the other
# sharers (layers 6 and 7 fill the same regions again, but find only the 1.0s the first fill left). The six fills
# that wiped nothing are exactly: the four owners' warmup fills, which run before anything is written, and those
# two late fills of the second sharers. The table below comes from the reproduction's own `run_engine` and
# `format_census` (the ones `minikv repro scale-wipe` prints and checks), with upstream's census on gemma-4-E2B-it
# underneath, as the vLLM fix's description reports it: fills that wiped nothing, tagged "(pre-write)", and two
# late fills that wiped written scales. Upstream does not say which layers made its fills. That its harmless ones
# include later sharers' fills that found only 1.0s, as minikv's do, is minikv's inference from the mechanism, not
# something upstream reports.

# %%
census_run = scale_wipe.run_engine(FORMAT, 4, False, True, prompts, backend=BACKEND)
print(scale_wipe.format_census(census_run))
assert scale_wipe.check_census(census_run) == []
assert scale_wipe.census_counts(census_run) == {"harmless": 6, "warmup": 4, "late_harmless": 2, "wiping": 2}
assert census_run.texts == texts_buggy

# %% [markdown]
# ### Going further: upstream's own topology, 33 fills that wipe nothing and 2 that wipe
#
# (This part, down to the byte map, compares minikv's count of fills with upstream's; the story does not need it.)
# The census above has minikv's shape, not upstream's (6 and 2 against 33 and 2), because tiny-gemma4 has 8 layers.
# `tiny-gemma4-e2b` is shipped with gemma-4-E2B's published text config, with only the widths shrunk: 35 layers of
# 4 sliding : 1 full, the last 20 sharing KV, so layers 15-34 read the storage of layer 13 (sliding) or layer 14
# (full); 8 query heads over 1 KV head of size 256 (sliding) and 512 (full); window 512, per-layer inputs,
# double-wide MLPs on the sharing layers, soft-capping. Its weights are random: which layers fill which storage,
# and when, does not depend on weights, only on the topology and the warmup. A random model's answers are never
# right, so a damaged request is one whose output differs from the fixed engine's; here that is shown after one
# step, by the sharing layers' attention outputs (a request whose batch read no wiped scale computes exactly what
# the fixed engine computes, bit for bit), because a random model's tokens can take a few steps to diverge.
# `minikv repro scale-wipe --model tiny-gemma4-e2b` judges by the tokens of 12-token answers
# (`results/scale_wipe_e2b.json`).

# %%
from minikv.models import registry  # noqa: E402

E2B = scale_wipe.E2B_MODEL
e2b_config = registry.CHECKPOINT_CONFIGS[E2B]
for key in ("num_hidden_layers", "num_kv_shared_layers", "sliding_window", "num_attention_heads",
            "num_key_value_heads", "head_dim", "global_head_dim", "hidden_size_per_layer_input",
            "use_double_wide_mlp", "final_logit_softcapping"):
    print(f"{key:28s} {e2b_config[key]!s:>8s}   (gemma-4-E2B's)")
for key, theirs in registry.E2B_SHRUNK.items():
    print(f"{key:28s} {e2b_config[key]!s:>8s}   shrunk from {theirs:,}")
print("layer types:", "".join("S" if t == "sliding_attention" else "F" for t in e2b_config["layer_types"]))

# %%
e2b_prompts = scale_wipe.make_prompts(8, model=E2B)
e2b_runs = {buggy_run: scale_wipe.run_engine(FORMAT, 4, False, buggy_run, e2b_prompts, backend=BACKEND,
                                             max_tokens=1, model=E2B, capture_attention=True)
            for buggy_run in (False, True)}
scale_wipe.compare(e2b_runs[False], e2b_runs[True])
print(scale_wipe.format_census(e2b_runs[True]))
assert scale_wipe.check_census(e2b_runs[True]) == [] and scale_wipe.check_census(e2b_runs[False]) == []
assert scale_wipe.census_counts(e2b_runs[True]) == {"harmless": 33, "warmup": 15, "late_harmless": 18, "wiping": 2}
e2b_damaged = scale_wipe.attention_damage(e2b_runs[False], e2b_runs[True])
print("\nrequests whose step-0 attention outputs in the 20 sharing layers differ from the fixed engine's:",
      ranges(e2b_damaged), "(the first batch); fixed engine's late fills:",
      [f.layer for f in e2b_runs[False].fills if f.step >= 0] or "none")
assert e2b_damaged == [0, 1, 2, 3]
print("\nquantities of this pair (the ones results/scale_wipe_e2b.json holds):")
print(scale_wipe.format_quantities([(e2b_runs[False], e2b_runs[True])]))

# %% [markdown]
# The count is upstream's because the layout is: 15 owning layers fill at warmup, and 20 sharing layers fill at
# step 0, of which the first sharer of each shared storage (layer 15 for layer 13's, layer 19 for layer 14's) wipes
# the scales the owner has just written, and the other 18 find only the 1.0s that wipe left. 15 + 18 = 33 fills
# that wipe nothing, 2 that wipe. **Which layer made each fill is minikv's reading**: upstream gives the totals only.
# The two counts of wiped scales are equal here (each storage holds one K and one V scale per prompt token of the
# first batch, with one KV head in both) while upstream's differ (22,384 and 13,394); upstream does not say how it
# counted, and minikv does not reproduce that difference.
#
# **Upstream's "(pre-write)".** Upstream tags its 33 harmless fills "(pre-write)". In minikv's reading only the 15
# owners' fills come before a write; the 18 later sharers fill after the owner wrote the step's tokens, but after
# the first sharer's wipe too, so they overwrite nothing. Can a warmup make all 33 precede the first write while
# the same 2 still wipe? The table runs the census under three warmups (the same 8 requests; the dummy row is the
# run above): upstream's dummy warmup, CUDA-graph capture's (every layer runs with metadata), and a hand-picked one
# that touches exactly the 18 later sharers before the first step.

# %%
warmup_rows = scale_wipe.warmup_census(e2b_prompts, 4, backend=BACKEND, model=E2B, max_tokens=1,
                                       damage="attention", runs=(e2b_runs[False], e2b_runs[True]))
print(scale_wipe.format_warmup_census(warmup_rows, E2B))
assert scale_wipe.check_warmup_census(warmup_rows, 4) == []
picked = next(r for r in warmup_rows if r.case == "later sharers")
assert len(picked.pre_write) == 33 and picked.wiping == [15, 19]

# %% [markdown]
# Only the hand-picked warmup gives a literal "33 (pre-write), 2 wiping". No engine's warmup has that shape: a
# warmup forward runs every layer in order under one set of attention metadata, so either no sharer is touched
# (dummy: the same 2 wipe, and 18 of the 33 come after a write) or every sharer is (capture: the first sharers
# too, and nothing wipes). Touching the later sharers but not the first of each storage would take a warmup that
# knows which sharer comes first. So minikv reads upstream's tag as describing what the 33 fills found, not when
# they ran: a fill that finds only 1.0s and 0s cannot tell, from the storage's contents, whether it came before
# any write or after the wipe.

# %% [markdown]
# **The byte map, by request and layer.** Which bytes of which storage, belonging to which request, did the wipe
# hit? `scale_wipe_trace.storage_map` reads the first step's block tables and the census's record of the scales
# each late fill replaced. Top: every block the first batch holds in each storage, labelled with its request, red
# where its rows lost their scales, with the layer whose fill did it. Bottom: one slot's bytes in layer 2's
# storage, row by row: the int8 codes are untouched, the four scale bytes after each row now hold 1.0.

# %%
map_engine = engine(buggy=True)
map_ids = [map_engine.add_request(p, params) for p in prompts[:4]]
first_step = map_engine.step()
smap = scale_wipe_trace.storage_map(map_engine, first_step)
for st in smap.storages:
    wiped_requests = sorted({r for _, r, _, w in st["blocks"] if w})
    print(f"layer {st['owner']}'s storage (read by {st['readers'] or 'no other layer'}): "
          f"{len(st['blocks'])} blocks of requests {ranges(sorted({r for _, r, _, _ in st['blocks']}))}; "
          f"rows wiped by layer {st['wiped_by']}: requests {ranges(wiped_requests) or 'none'}")
assert [st["wiped_by"] for st in smap.storages] == [None, None, 4, 5]
assert all(all(w == n for _, _, n, w in st["blocks"]) for st in smap.storages if st["wiped_by"])
del map_engine
viz_scale_wipe.storage_byte_map(smap)

# %% [markdown]
# ## 8. Which requests
#
# The buggy engine's requests as the scheduler batched them (rows are batches of `max_num_seqs`), green when the
# answer is right: only the first row is red.

# %%
assert [not ok for ok in right_buggy] == [i in damaged for i in range(len(prompts))]
viz.request_grid([not ok for ok in right_buggy], max_num_seqs=4, title="Buggy engine")

# %% [markdown]
# **minikv's own observation: prefix caching carries the damage further.** (Upstream called the apparent
# dependence on prefix caching spurious; this is not one of its symptoms.) With prefix caching on, a finished
# request's full blocks stay in the cache for later requests with the same prefix. If those blocks were written in
# the first batch, their scales in the shared storages are the wiped 1.0s, and a later request that reuses them
# reads the inflated K/V even though it was never in the first batch. To see it we need prompts longer than one
# block (16 tokens): 8 distinct 40-token prompts (two full blocks each), then the first four again. The grid says,
# for every request that reused cached blocks, whose blocks they were (from the block tables of the step trace).

# %%
distinct = list(dict.fromkeys(task.prompts(16, seed=1, num_tokens=40)))[:8]   # 8 different prompts
assert len(distinct) == 8
long_prompts = distinct + distinct[:4]
steps_seen = []

runs = {}
for buggy_run in (False, True):
    llm = engine(buggy=buggy_run, enable_prefix_caching=True)
    steps_seen.clear()
    outs = serve(llm, long_prompts, params, steps_seen.append)
    runs[buggy_run] = [o.text for o in outs]
    hits = [next(s.num_cached_tokens[o.request_id] for s in steps_seen
                 if s.is_prefill and o.request_id in s.request_ids) for o in outs]
    wiping = [f.layer for f in llm.census.wiping]
    print(f"{'buggy' if buggy_run else 'fixed'}: prefix-cache hits (tokens) per request {hits}; "
          f"layers whose late fill wiped scales: {wiping or 'none'}")
    assert hits == [0] * 8 + [32] * 4
    # Each wiping fill resets one K and one V scale per kv head of every token of the first batch: 4 x 40 tokens.
    assert all(f.overwritten == 2 * layout.num_kv_heads * 4 * 40 for f in llm.census.wiping)
sources = scale_wipe_trace.prefix_sources(steps_seen, BLOCK_SIZE)
prefix_damaged = [i for i, p in enumerate(long_prompts)
                  if runs[True][i] != runs[False][i] and not task.check(p, runs[True][i])]
print("fixed engine wrong:", ranges([i for i, p in enumerate(long_prompts) if not task.check(p, runs[False][i])]))
print("buggy engine damaged:", ranges(prefix_damaged), "; reused blocks:", sources)
assert all(task.check(p, t) for p, t in zip(long_prompts, runs[False]))
assert prefix_damaged == [0, 1, 2, 3, 8, 9, 10, 11] and sources == {8: 0, 9: 1, 10: 2, 11: 3}
viz_scale_wipe.request_sources_grid([not task.check(p, t) for p, t in zip(long_prompts, runs[True])],
                                    max_num_seqs=4, sources=sources, title="Buggy, prefix caching")

# %% [markdown]
# Requests 8-11 ran in the third batch, long after the wipe, and are damaged anyway: each reused the two wiped
# blocks its twin (0-3) wrote in the first batch. Requests 4-7 (the second batch, no shared prefix with the first)
# are fine.
#
# **The rule, with eviction.** With prefix caching on, a request is damaged when it ran in the first step, or when
# at its own prefill it finds in the prefix cache a block that the first step wrote (so the wipe reset its scales)
# and that nobody has written since. For a copy of an earlier prompt that takes three things:
#
# 1. its prompt fills at least one full block (16 tokens): only full blocks are cached;
# 2. its twin ran in the first batch;
# 3. the twin's blocks are still cached when the copy is scheduled. A finished request's blocks stay *cached-free*
#    (findable by their hash); the block manager hands out never-used blocks first and evicts cached-free ones,
#    oldest first, only when none is left. A pool that later batches fill up evicts the wiped blocks, and with them
#    the damage.
#
# `scale_wipe.prefix_reuse` checks the rule on the 24 requests of section 4 (12 prompts, then the same 12 again),
# on a buggy engine with prefix caching on: for every copy, the step its prefill ran, the full blocks its prompt
# fills, how many it found in the cache, how many of those were wiped, and how many cached blocks the block
# manager had evicted before (read from the step outputs and the block manager itself).

# %%
reuse = {seqs: scale_wipe.prefix_reuse(prompts, seqs, backend=BACKEND) for seqs in (4, 8)}
for run in reuse.values():
    print(scale_wipe.format_prefix_reuse(run), end="\n\n")
    assert run.predicted == run.damaged                       # the rule explains every damaged request
assert all(r.found == 0 and r.evictions > 0 and r.full_blocks > 0 for r in reuse[4].requests[12:16])
assert [r.request for r in reuse[8].requests[12:] if r.full_blocks == 0] == [18]

# %% [markdown]
# * **max_num_seqs=4: only 0-3.** The copies of the first batch (12-15) run at step 36, in the fourth batch. By
#   then the second and third batches have used up the never-used blocks of the 32-block pool and evicted
#   cached-free blocks, oldest first: the first batch's. A prefix is found only from its first block on, and each
#   copy's first block is gone: the copies find nothing in the cache, recompute their prompts with real scales,
#   and come out right.
# * **max_num_seqs=8: 0-7, 12-17, 19.** The 64-block pool never evicts. Copies 12-17 find all their twins' full
#   blocks, wiped. Request 18 is the copy of request 6, whose 11-token prompt fills no block: nothing to find.
#   Request 19, the copy of request 7, finds its one full block, wiped. Copies 20-23 find the second batch's
#   blocks, written with real scales.

# %% [markdown]
# ### Prefix caching and the order of the copies: upstream's "exactly the first batch"
#
# Upstream reports exactly the first batch damaged with prefix caching on and off, for max_num_seqs 4, 6 and 8, on
# "48 arithmetic-continuation prompts x 4 copies". minikv damages later copies too when they reuse wiped blocks.
# Which order of the copies and which prompts give which outcome? The buggy engine, prefix caching on, 6 prompts x 4
# copies (4 new tokens each), in two orders: the copies after the distinct prompts (p0 .. p5, p0 .. p5, ...) or next
# to each other (p0, p0, p0, p0, p1, ...); with prompts of 12 tokens (no full 16-token block, so nothing is cached
# before the answer fills the block) or of 40 (two full blocks).

# %%
prefix_runs = scale_wipe.prefix_caching_runs(max_num_seqs=(4, 6), backend=BACKEND)
print(scale_wipe.format_prefix_runs(prefix_runs))
assert scale_wipe.check_prefix_runs(prefix_runs) == []

# %% [markdown]
# * **No full block**: exactly the first batch, in both orders, for every max_num_seqs: a copy finds nothing of
#   its twin's in the cache, because only full blocks are cached and the prompt does not fill one.
# * **Full blocks, copies after the first batch**: every later copy of a first-batch prompt reuses its wiped
#   blocks (with max_num_seqs 6 the first batch holds all 6 prompts, so all 24 requests are damaged).
# * **Full blocks, copies next to each other**: exactly the first batch when max_num_seqs is a multiple of the 4
#   copies (all copies of a prompt run in the same batch), not otherwise: at 6, prompt p1's last two copies run in
#   the second batch and reuse p1's wiped blocks (requests 6 and 7).
#
# Upstream saw exactly the first batch at 4, 6 and 8 with prefix caching on. By the rule above that happens when no
# later copy finds a wiped block: the prompts fill no full block (16 tokens is vLLM's default block size, as
# minikv's), or the copies are scheduled only after their twins' blocks were evicted, or every copy runs inside the
# first batch. Upstream's text gives neither its prompt lengths nor its pool size, so minikv cannot tell which
# (short arithmetic windows would fill no block). That may also be why the first pull request could call the
# prefix-caching dependence spurious (minikv's guess; upstream does not say). minikv's claim stays its own: prefix
# caching carries the damage to later requests exactly when they find, still cached, full blocks written in the
# first batch.

# %% [markdown]
# ## 9. The fix, checked
#
# With the once-per-storage registry, the sharing layers' first touch finds their storage already initialized and
# leaves it alone. Three checks.
#
# **Outputs equal a clean reference.** The fixed int8 engine's 24 answers are all right by the task, and equal,
# string for string, to those of the float32 (`auto`) cache, which has no scales to wipe.

# %%
reference = clean16[0].texts
print("fixed int8 == float32 reference:", texts_fixed == reference)
print("all right by the task:", all(task.check(p, t) for p, t in zip(prompts, texts_fixed)))
assert texts_fixed == reference
assert all(task.check(p, t) for p, t in zip(prompts, texts_fixed))

# %% [markdown]
# **A request's KV bytes do not depend on when it ran.** Run the first four prompts as an engine's first batch;
# then, in a fresh engine, run four other prompts first and the same four as the second batch. Read request
# `x = prompts[0]`'s rows (codes and scales, every owning layer) right after its prefill. The batch around `x` is
# the same four requests in both runs; only its place in the engine's life changes. With the fix the bytes are
# identical. With the historical code, layers 2 and 3 (the shared storages) differ, and only in the scale bytes.

# %%
def kv_bytes_of(prompt_list, target, buggy_run):
    """Raw cache rows (codes + inline scales) of request `target`, per owning layer, right after its prefill."""
    llm = engine(buggy=buggy_run)
    rows, when = {}, {}
    target_id = prompt_list.index(target)            # request ids count from 0 in a fresh engine

    def grab(out):
        if out.is_prefill and target_id in out.request_ids and not rows:
            when["step"] = out.step
            for pool in out.trace.pools_written():       # the KV-owning layers' pools
                flat, layout_ = llm.arena.pool(pool).view(-1), llm.arena.layout(pool)
                chunks = []
                for s in out.block_slots(target_id, BLOCK_SIZE):
                    b, o = divmod(s, BLOCK_SIZE)
                    for kv in (0, 1):
                        at = layout_.row_offset(b, kv, o, 0)
                        chunks.append(flat[at:at + layout_.slot_bytes].clone())
                rows[pool.removeprefix("kv.")] = torch.stack(chunks)
    serve(llm, prompt_list, minikv.SamplingParams(temperature=0, max_tokens=1), grab)
    return rows, when["step"]


x = prompts[0]
in_scale_byte = (torch.arange(layout.slot_bytes) % layout.row_bytes) >= layout.scale_offset
for buggy_run in (False, True):
    first_rows, first_step = kv_bytes_of(prompts[:4], x, buggy_run)
    later_rows, later_step = kv_bytes_of(prompts[4:8] + prompts[:4], x, buggy_run)
    assert (first_step, later_step) == (0, 1)
    print(f"{'buggy' if buggy_run else 'fixed'} engine, x prefilled at step 0 vs step 1:")
    for name, rows_first in first_rows.items():
        diff = rows_first != later_rows[name]
        # Counted per 4-byte scale, not per byte: a real scale can share a byte with 1.0 (0x3f800000) by chance.
        scales_differ = int(diff[:, in_scale_byte].reshape(diff.shape[0], -1, 4).any(dim=2).sum())
        print(f"  {name:20s} identical: {torch.equal(rows_first, later_rows[name])!s:5s} "
              f"differing scales: {scales_differ:3d}, differing codes: {int(diff[:, ~in_scale_byte].sum())}")
        if buggy_run and name in TARGETS:
            assert diff.any() and not diff[:, ~in_scale_byte].any()
        else:
            assert torch.equal(rows_first, later_rows[name])

# %% [markdown]
# **sleep() / wake_up() initializes every scale region again, in both sleep modes.** `sleep(mode="discard")` keeps
# the arena's storage at its address and discards the pools' contents (zeroed here); that a sleep can wake up at
# the same address is minikv's reading of upstream's key, (data_ptr, nbytes), which upstream says re-initializes
# "re-allocated caches (sleep/wake_up)" without saying whether the address changes.
# `sleep(mode="free")` frees the arena, and `wake_up()` allocates a new one. A key of (address, size) cannot tell a
# same-address wake-up from no sleep at all, so the fixed runner releases the registry entries at `sleep()`. Either
# way the census gains one warmup fill per owning layer, every scale of the pools reads 1.0, and the first batch
# after waking up gives the same answers as before.

# %%
for mode in ("discard", "free"):
    fills_before = len(fixed.census.fills)
    address = fixed.arena.storage.data_ptr()
    fixed.sleep(mode=mode)
    fixed.wake_up()
    if mode == "discard":
        assert fixed.arena.storage.data_ptr() == address
    show_census(fixed, f"fixed, fills since sleep(mode={mode!r})", since=fills_before)
    new_fills = fixed.census.fills[fills_before:]
    assert [f.layer for f in new_fills] == owners and all(f.step == -1 and f.overwritten == 0 for f in new_fills)
    for a in fixed.attention_layers.values():
        k, v = fixed.kv_layout.scale_views(a.kv_cache)
        assert bool((k == 1).all()) and bool((v == 1).all())
    again = [o.text for o in fixed.generate(prompts[:4], params, use_tqdm=False)]
    print(f"first batch after wake_up ({mode}):", again)
    assert again == texts_fixed[:4]
assert not fixed.census.wiping

# %% [markdown]
# The buggy engine behaves as upstream's: an impl that has its views returns early for good, and nothing tells it
# about a sleep. So the wipe happens once per engine start. After `wake_up()` no impl fills anything and the first
# batch is right. (The scale slots are then 0.0, not 1.0, and no minikv kernel reads them: its loads are masked.
# `minikv repro scale-wipe` shows which readers would see an unwritten slot.)

# %%
fills_before = len(buggy.census.fills)
buggy.sleep(mode="discard")
buggy.wake_up()
again_buggy = [o.text for o in buggy.generate(prompts[:4], params, use_tqdm=False)]
show_census(buggy, "buggy, fills since sleep()", since=fills_before)
print("first batch after wake_up:", again_buggy)
assert buggy.census.fills[fills_before:] == []
assert again_buggy == texts_fixed[:4]

# %% [markdown]
# **Same code, different warmup.** Upstream's fix says the wipe happens "when warmup didn't exercise" the sharing
# layers. minikv's `ReproConfig(warmup="capture")` runs every layer with attention metadata (minikv models it on a CUDA-graph
# capture run, which executes every layer; the upstream text does not name the warmup shapes that hide the
# defect). It gives the sharing impls their first touch before anything is written, so the historical code wipes
# nothing.

# %%
capture = engine(buggy=True, repro=minikv.ReproConfig(warmup="capture"))
texts_capture = [o.text for o in capture.generate(prompts[:8], params, use_tqdm=False)]
show_census(capture, "buggy engine, capture-shaped warmup")
assert not capture.census.wiping and texts_capture == texts_fixed[:8]
print("first two batches equal to the fixed engine's:", texts_capture == texts_fixed[:8])

# %% [markdown]
# **Why it looked stochastic.** A server does not get its requests all at once. Below, the buggy engine is driven
# step by step (`add_request()` / `step()`) while requests arrive over several steps, 0 to 4 of them before each
# step at seeded random times. The damaged requests are exactly the ones the first step ran, however many that
# was: when a request arrives, not what it asks, decides whether it is hit. Under multiprocess serving that
# timing varies from run to run, which is how the defect looked random upstream.

# %%
arrivals = [scale_wipe.arrival_run(prompts[:8], 4, seed, backend=BACKEND) for seed in range(4)]
print(scale_wipe.format_arrivals(arrivals))
assert all(r.damaged == r.first_batch for r in arrivals)
assert len({tuple(r.first_batch) for r in arrivals}) > 1

# %% [markdown]
# ## 10. Try it yourself
#
# Three exercises, in the style of Sebastian Raschka's *LLMs from scratch*. Each has three cells: put your answer
# into the first (replace `None`) and run it; the second runs the engine, computes the true answer and says whether
# yours is right, without printing it; the third is the worked solution, folded (in JupyterLab, click the bar left
# of it; on the docs site, click "Solution"). The notebook tests run all three, with no answer filled in.
#
# **Exercise 1: prefix caching with `max_num_seqs=6`.** Serve the same 24 requests (12 prompts, then the same 12
# again) on the buggy engine with prefix caching on and 6 requests per batch (a pool of 48 blocks). Which requests
# are damaged? (Think about which copies can find their twin's blocks still in the cache, and what the block
# manager may have evicted by then.)

# %% tags=["exercise"]
my_answer_1 = None   # your answer: a list of request numbers

# %% tags=["check"]
from minikv.viz.exercises import check

fixed_pc = scale_wipe.run_engine(FORMAT, 6, True, False, prompts, backend=BACKEND)
buggy_pc = scale_wipe.run_engine(FORMAT, 6, True, True, prompts, backend=BACKEND)
scale_wipe.compare(fixed_pc, buggy_pc)
check("Exercise 1", my_answer_1, buggy_pc.damaged)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: the first batch (0-5) and their copies (12-17). The copies of prompts 0-5 run in the third batch, at
# step 24. The second batch (6-11) took never-used blocks of the 48-block pool, so nothing was evicted yet: these
# copies find their twins' full blocks, written and wiped in the first step, and reuse them. The copies of 6-11
# (18-23) find the second batch's blocks, which have real scales (18's prompt fills no block at all). With
# max_num_seqs=4 the same copies come after the wiped blocks were evicted: only 0-3.
reuse_6 = scale_wipe.prefix_reuse(prompts, 6, backend=BACKEND)
print(scale_wipe.format_prefix_reuse(reuse_6))
assert reuse_6.predicted == reuse_6.damaged == buggy_pc.damaged
assert all(r.step == 24 and r.evictions == 0 and r.found_wiped == r.full_blocks > 0 for r in reuse_6.requests[12:18])
assert buggy_pc.damaged == [0, 1, 2, 3, 4, 5, 12, 13, 14, 15, 16, 17] and fixed_pc.damaged == []
print("answer:", ranges(buggy_pc.damaged))

# %% [markdown]
# **Exercise 2: half the block size.** Run the buggy engine with `block_size=8` instead of 16 on the same 24
# requests. How many written scales does each of the two wiping fills overwrite now?

# %% tags=["exercise"]
my_answer_2 = None   # your answer: a number of scales

# %% tags=["check"]
small_blocks = engine(buggy=True, block_size=8)
texts_small = [o.text for o in small_blocks.generate(prompts, params, use_tqdm=False)]
wiped_small = [f.overwritten for f in small_blocks.census.wiping]
assert len(set(wiped_small)) == 1
check("Exercise 2", my_answer_2, wiped_small[0])

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: as many as with block size 16. A fill covers the whole storage, whatever its block size, and the first
# batch wrote one K and one V scale per kv head for each of its prompt tokens: 2 x 2 x the batch's tokens in each
# shared storage. The damaged requests do not change either: upstream saw the damage seem to depend on "batch
# geometry"; it depends only on which requests the first step ran.
damaged_small = [i for i, (p, t) in enumerate(zip(prompts, texts_small)) if not task.check(p, t)]
assert wiped_small == [f.overwritten for f in buggy.census.wiping] == [2 * layout.num_kv_heads * batch_tokens] * 2
assert damaged_small == [0, 1, 2, 3]
print("answer:", f"{wiped_small[0]:,}", f"= 2 x {layout.num_kv_heads} x {batch_tokens}; damaged: {ranges(damaged_small)}")

# %% [markdown]
# **Exercise 3: fp8 instead of int8.** With `fp8_per_token_head`, the code limit is 448 instead of 127. How many
# times larger (or smaller) than int8's is the fp8 cache's median K inflation, roughly? (Within 0.5 counts.)

# %% tags=["exercise"]
my_answer_3 = None   # your answer: a number, fp8's K inflation / int8's

# %% tags=["check"]
fp8_fixed, fp8_buggy = next((f, b) for f, b in pairs if b.kv_cache_dtype == "fp8_per_token_head"
                            and b.max_num_seqs == 4)
ratio = fp8_buggy.k_inflation / headline.k_inflation
check("Exercise 3", my_answer_3, ratio, abs_tol=0.5)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: larger, by about 448 / 127 = 3.5. The inflation of a row is 1 / its true scale, and the true scale is
# amax / QMAX: the same K with a 3.5x larger QMAX gets a 3.5x smaller scale, so a wiped (1.0) scale inflates it
# 3.5x more. (Not exactly 3.5: e4m3 rounds the codes differently, which moves the median row a little.)
assert 3.0 < ratio < 4.0
print("answer: between 3 and 4, about", f"{448 / 127:.1f}", f"(fp8 {scale_wipe.times(fp8_buggy.k_inflation)}, "
      f"int8 {quantities['k_inflation']['display']})")

# %% [markdown]
# ## Summary
#
# * KV-sharing layers get their target's cache tensor itself, so per-impl state about "my cache" is really
#   per-impl state about someone else's storage. `tiny-gemma4`, like Gemma 4, has several sharers per storage.
# * The historical code filled a storage's inline scales with 1.0 on each impl's first touch. Warmup gives the
#   owning layers their first touch harmlessly; the first sharer's first touch falls inside step 0, after the
#   prompt's scales are written, and resets them, and the other sharers' fills find only 1.0s: per storage one
#   wiping late fill and harmless late fills (upstream reports two wiping fills and harmless ones, without
#   naming the layers). The codes survive, so K and V come back inflated
#   by exactly 1 / true scale; the sharers and the owners of the shared storages then read wiped rows at every
#   step of the first batch, an attention head collapses onto one inflated key, and exactly the first batch is
#   wrong. A warmup that touches every layer hides it. In minikv, prefix caching hands the wiped blocks to a later
#   request that finds them still cached, not to one that comes after they were evicted (minikv's observation,
#   not upstream's). The wipe happens once per engine start: the historical views outlive `sleep()`.
# * The fix fills once per storage (a registry keyed by address and size, with a weak reference to the storage
#   itself to notice a reused address). After it, outputs equal the float32 cache's, a request's KV bytes do not
#   depend on when it ran, and a woken-up engine initializes every scale region again in both sleep modes.
#
# Next: [notebook 04](04_cross_attention_stride_doubling.ipynb), the second defect. Docs:
# [KV sharing](../docs/concepts/kv-sharing.md), [Defect A](../docs/defects/scale-wipe.md),
# [glossary](../docs/glossary.md).
