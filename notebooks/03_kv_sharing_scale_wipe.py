# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · KV sharing and the scale wipe
#
# This notebook takes apart a defect that shipped in vLLM's Triton attention backend: with an int8 or fp8
# *per-token-head* KV cache, a model whose last layers share an earlier layer's KV cache (the Gemma 4 family)
# answered the first `max_num_seqs` requests an engine ever served wrongly, and every later request correctly.
# A vLLM pull request fixed it and called it the likely root cause of issues #50702 and #50749 (the upstream
# text minikv works from, `shared/upstream/vllm-scale-wipe.md`, does not give the pull request's number).
#
# No single line of the old code is wrong on its own. The defect is where three reasonable ideas meet:
#
# 1. **KV sharing.** A sharing layer has no K/V projections; it attends over the cache of an earlier layer, and
#    the engine hands it *the same tensor object*.
# 2. **Inline scales need a one-time fill.** Each cache row carries its own fp32 scale. A new cache is all zero
#    bytes, so its scale slots must be set to 1.0 once, and the old code did that lazily, the first time each
#    *attention impl* touched its cache.
# 3. **Warmup only touches layers that own a cache.** The dummy forward at start-up has no attention metadata;
#    owning layers still run their cache update (writing nothing) and so do their one-time fill, while sharing
#    layers do nothing. Their first touch comes in the middle of the first real forward pass.
#
# Put together, a sharing layer's "one-time" fill lands on a storage its target layer has just filled with the
# prompt's real scales, and resets them to 1.0. We go through each idea with minikv's code as evidence, reproduce
# the damage, measure it, and then check the fix.
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
from minikv.attention.impl import AttentionImpl, ScaleFillCensus
from minikv.repro import scale_wipe
from minikv.repro.common import dequantized_rows, ranges, stored_scales

torch.manual_seed(0)
torch.set_num_threads(1)   # the tiny model's ops are too small to gain from threads on a CPU
DEVICE = "cpu"
BACKEND = "torch"          # the bulk runs; see the note above
FORMAT = "int8_per_token_head"
BLOCK_SIZE = 16            # the engines' default block size
task = minikv.tasks.for_model("tiny-kvshare")


def engine(buggy=False, **kw):
    """A tiny-kvshare engine on CPU; `buggy=True` reintroduces the historical scale-view setup."""
    kw = {"kv_cache_dtype": FORMAT, "max_num_seqs": 4, "device": DEVICE, "backend": BACKEND, **kw}
    return minikv.LLM(model="tiny-kvshare", reintroduce=("scale-wipe",) if buggy else (), **kw)


print(minikv.bugs.DEFECTS["scale-wipe"].summary)
print("code site:", minikv.bugs.DEFECTS["scale-wipe"].code_site)

# %% [markdown]
# ## 1. KV sharing: two layers, one tensor
#
# `tiny-kvshare` has six decoder layers. `config.kv_sharing = {4: 2, 5: 3}` says layer 4 attends over layer 2's
# keys and values and layer 5 over layer 3's; layers 4 and 5 have query projections only. The model runner
# allocates one pool per *owning* layer in the KV arena and then binds caches: an owning layer gets its pool, and a
# sharing layer gets its target's cache, the very same Python object.
#
# We build the fixed engine now (it also serves the reproduction in section 4).

# %%
fixed = engine()
layers = fixed.attention_layers                             # name -> the model's attention op, as the engine bound it
self_layers = [a for a in layers.values() if a.kind == "self"]
print("kv_sharing:", fixed.model_config.kv_sharing)
print("pools in the arena:", list(fixed.arena.specs))
print()
print(f"{'layer':20s} {'k/v projections':>15s}  {'reads the cache of':20s} {'kv_cache is the owner':>22s}")
for block, a in zip(fixed.model.layers, self_layers):
    owner = layers[a.kv_sharing_target] if a.kv_sharing_target else a
    print(f"{a.layer_name:20s} {hasattr(block, 'k_proj') and hasattr(block, 'v_proj')!s:>15s}  "
          f"{owner.layer_name:20s} {a.kv_cache is owner.kv_cache!s:>22s}")
impls = {id(a.impl) for a in self_layers}
print(f"\n{len(self_layers)} layers, {len(impls)} distinct attention impls, "
      f"{len({id(a.kv_cache) for a in self_layers})} distinct cache tensors")

layer2, layer4 = layers["layers.2.self_attn"], layers["layers.4.self_attn"]
assert layer4.kv_cache is layer2.kv_cache                  # not a copy, not a new view: the same object
assert layer4.impl is not layer2.impl                      # ...reached through two different impls
assert len(fixed.arena.specs) == 4                         # four pools for six layers

# %% [markdown]
# Each layer still has its **own attention impl**, and the impl is where per-layer state lives. That is the
# trap: anything an impl does "the first time it sees its cache" happens once per impl, so twice for a storage
# that two layers share, and the second time at whatever moment the second layer first runs. A sharing layer
# never writes K/V, so a per-impl action that changes the cache's bytes is suspect: it changes bytes that
# belong to another layer.

# %% [markdown]
# ## 2. Per-token-head quantization and inline scales
#
# In the per-token-head formats, each head vector `x` of each token is stored as `head_size` one-byte codes
# plus its own fp32 scale, `scale = max(amax(|x|) / QMAX, eps)` and `code = round(x / scale)` (QMAX 127 for
# int8, 448 for fp8 e4m3). The scale sits right after the codes in the same row, so a row of `tiny-kvshare`
# (head size 32) is 36 bytes. The previous notebook covers the formats in detail; here we only need the row.

# %%
layout = fixed.kv_layout
print(layout.describe())
print(f"row: {layout.head_size} codes x {layout.elem_bytes} byte + 4-byte scale at byte {layout.scale_offset} "
      f"= {layout.row_bytes} bytes; slot: {layout.num_kv_heads} rows = {layout.slot_bytes} bytes; "
      f"block: K then V, {layout.block_bytes} bytes")
viz.row_layout_diagram(layout)

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
# `minikv/attention/impl.py`. The historical version fills on the first touch **by this impl**, and from then on
# returns early for good, as upstream's `_ensure_scale_caches` does:

# %%
print(inspect.getsource(AttentionImpl._scale_views_historical))

# %% [markdown]
# The fixed version also builds its views per impl, but fills once **per storage**, whichever impl touches it
# first. A class-level registry is keyed by (first byte's address, size in bytes), and each entry holds a weak
# reference to the storage itself (`tensor.untyped_storage()`, not one tensor viewing it): two views of one
# storage count once, two pools packed in one allocation are two entries, and a new allocation that lands at a
# freed storage's address no longer matches the dead reference and is filled again.

# %%
print(inspect.getsource(AttentionImpl._scale_views_once_per_storage))

# %% [markdown]
# ## 3. Warmup: who touches the cache first
#
# At start-up the runner runs one dummy forward with **no attention metadata**, as the real engines do. The
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
# wiping nothing, and the sharing layers' impls have not touched anything yet.

# %%
buggy = engine(buggy=True)


def show_census(llm, label, since=0):
    """The census of `llm` from its fill number `since` on: a summary line, then one line per fill."""
    fills = llm.census.fills[since:]
    print(f"{label}: {ScaleFillCensus(fills).summary()}")
    for f in fills:
        print(f"  {f.layer:20s} step {f.step:2d}  overwrote {f.overwritten:6,} written scales")


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
# nothing. In the buggy engine, it will fill, during step 0, right after layers 2 and 3 have quantized the
# prompt into those very storages.
#
# ## 4. The reproduction
#
# Upstream reproduced it on gemma-4-E2B-it with 48 arithmetic-continuation prompts, each submitted 4 times,
# greedy: the first `max_num_seqs` requests came out wrong in every run. `tiny-kvshare` was trained on the same
# kind of task (continue `"3 7 11 15"` with `" 19 23 27 ..."`), so every answer is objectively right or wrong.
# We use the same structure at CPU size: 12 prompts x 2 copies = 24 requests, greedy, 12 new tokens,
# `max_num_seqs=4`. Requests 0-11 are the distinct prompts and requests 12-23 their copies, in the same order.
#
# A request counts as **damaged** when the buggy engine's answer is wrong by the task's check *and* differs from
# the fixed engine's answer. We drive each engine one `step()` at a time (`serve` below), and right after step 0
# read the K/V of the first batch back from the pools of layers 2 and 3 (the sharing targets): codes, scales, and
# the dequantized values the kernels will read.

# %%
prompts = scale_wipe.make_prompts(24, copies=2)
params = minikv.SamplingParams(max_tokens=12)
TARGETS = ("layers.2.self_attn", "layers.3.self_attn")


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
    """After the engine's first step, read the first batch's rows back from the target pools."""
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

print(f"{'req':>3s} {'batch':>5s}  {'prompt (last 22 chars)':24s} {'fixed engine':14s} {'buggy engine':14s}")
for i, p in enumerate(prompts):
    mark = "DAMAGED" if i in damaged else ""
    print(f"{i:3d} {i // 4:5d}  {p[-22:]:>24s} {texts_fixed[i]!r:14s} {texts_buggy[i]!r:14s} {mark}")
print(f"\nfirst batch: requests {probe_buggy['requests']}; damaged: {ranges(damaged)}; "
      f"fixed engine wrong: {ranges([i for i, ok in enumerate(right_fixed) if not ok])}")

assert probe_buggy["requests"] == probe_fixed["requests"] == [0, 1, 2, 3]
assert damaged == [0, 1, 2, 3]                         # the whole first batch, and only it
assert all(right_fixed)
assert texts_buggy[4:] == texts_fixed[4:]              # later batches untouched
assert prompts[0] == prompts[12] and not right_buggy[0] and right_buggy[12]

# %% [markdown]
# Request 0 and request 12 carry the same prompt; only the one that happened to be scheduled first is wrong.
# The census says why: besides the four harmless warmup fills, the buggy engine logged two **late fills** at step
# 0, one by each sharing layer, each overwriting the scales its target had just written. Every K and V scale of
# the first batch's prompt tokens was overwritten: 2 (K and V) x 2 kv heads x the batch's token count.

# %%
show_census(buggy, "buggy")
show_census(fixed, "fixed")
batch_tokens = sum(probe_buggy["lengths"])
print(f"first batch: {batch_tokens} prompt tokens -> 2 x {layout.num_kv_heads} x {batch_tokens} = "
      f"{2 * layout.num_kv_heads * batch_tokens:,} scales per target layer")

late = buggy.census.wiping
sharing = {n: a.kv_sharing_target for n, a in buggy.attention_layers.items() if a.kv_sharing_target}
assert [f.layer for f in late] == list(sharing) and all(f.step == 0 for f in late)
assert all(f.overwritten == 2 * layout.num_kv_heads * batch_tokens for f in late)
assert all(f.step == -1 for f in buggy.census.harmless) and len(buggy.census.harmless) == 4
assert not fixed.census.wiping and len(fixed.census.fills) == 4

# %% [markdown]
# Upstream, the same census on Gemma 4 counted 33 fills that wiped nothing and 2 late fills that wiped 22,384 and
# 13,394 written scales: the same shape at a larger scale.
#
# The codes themselves survive the wipe. After step 0, the first batch's int8 codes in the target pools are
# byte-identical in the two engines; only the scales differ, and in the buggy engine every one of them is 1.0.

# %%
for name in TARGETS:
    f, b = probe_fixed[name], probe_buggy[name]
    assert torch.equal(f["k_code"], b["k_code"]) and torch.equal(f["v_code"], b["v_code"])
    assert bool((b["k_scale"] == 1).all()) and bool((b["v_scale"] == 1).all())
    print(f"{name}: codes identical; true K scales {f['k_scale'].min():.3f}..{f['k_scale'].max():.3f}, "
          "buggy engine's: all 1.0")

# %% [markdown]
# The same first batch on the `triton` backend (the Triton kernels, run by the interpreter): the buggy engine
# produces the same wrong tokens and the fixed engine the same right ones, and the census logs the same late fills.
# To keep the interpreter's time down, only the first batch runs, for 6 new tokens, compared with the first 6
# tokens of the runs above.

# %%
for buggy_run, reference_outs in ((False, outs_fixed), (True, outs_buggy)):
    llm = engine(buggy=buggy_run, backend="triton")
    got = llm.generate(prompts[:4], minikv.SamplingParams(max_tokens=6), use_tqdm=False)
    print(f"triton backend, {'buggy' if buggy_run else 'fixed'}: {[o.text for o in got]}; late fills: "
          f"{[(f.layer, f.overwritten) for f in llm.census.wiping]}")
    assert [o.token_ids for o in got] == [o.token_ids[:6] for o in reference_outs[:4]]
    assert [(f.layer, f.overwritten) for f in llm.census.wiping] == (
        [(f.layer, f.overwritten) for f in buggy.census.wiping] if buggy_run else [])
del llm

# %% [markdown]
# ## 5. Looking at the damage
#
# **The scales, before and after.** The census keeps a snapshot of what each late fill overwrote. For layer 2,
# the left panel is that snapshot (the scales layer 2 wrote for the first batch, captured inside layer 4's fill)
# and the right panel is what the pool holds after step 0. The snapshot equals, bit for bit, what the fixed
# engine stores in the same slots.

# %%
wipe_of_layer2 = next(f for f in late if sharing[f.layer] == "layers.2.self_attn")
idx = torch.tensor(probe_buggy["slots"])
blocks, offsets = idx // layout.block_size, idx % layout.block_size
before = wipe_of_layer2.wiped_k_scales[blocks, offsets]
after = probe_buggy["layers.2.self_attn"]["k_scale"]
assert torch.equal(before, probe_fixed["layers.2.self_attn"]["k_scale"])
assert bool((after == 1).all())
viz.scale_heatmap(before, after, title="Layer 2 K scales of the first batch's prompt tokens",
                  labels=("written by layer 2 (census snapshot)", "after layer 4's late fill"))

# %% [markdown]
# **The inflation.** A wiped row dequantizes as `code x 1.0` instead of `code x scale`, so every K and V vector of
# the first batch's prompt is blown up by exactly `1 / scale` of its own row. We measure it: the norm of each
# (token, head) K or V vector in the buggy engine's pool over the same vector in the fixed engine's pool, against
# `1 / true scale`.

# %%
for name in TARGETS:
    f, b = probe_fixed[name], probe_buggy[name]
    for part in ("k", "v"):
        norm_f, norm_b = f[part].norm(dim=-1), b[part].norm(dim=-1)
        live = norm_f > 0
        measured = norm_b[live] / norm_f[live]
        predicted = 1 / f[f"{part}_scale"][live]
        residual = (measured / predicted - 1).abs().max().item()
        assert residual < 1e-5, (name, part, residual)
        # Whole factors: the residual and the factors' last digits depend on the CPU's float arithmetic.
        print(f"{name} {part.upper()}: median inflation x{measured.median():.0f}, "
              f"range x{measured.min():.0f}..x{measured.max():.0f}; "
              f"equal to 1 / true scale within a relative {1e-5:.0e}")

k_clean = probe_fixed["layers.2.self_attn"]["k"]
k_wiped = probe_buggy["layers.2.self_attn"]["k"]
assert bool((k_wiped.abs().amax(dim=-1) == 127).all())    # what is left is the codes themselves
viz.k_magnitude_plot(k_clean, k_wiped, title="Layer 2 K, first batch",
                     labels=("fixed engine", "buggy engine (scales wiped)"))

# %% [markdown]
# The plot shows the largest |K| of each prompt token, over its heads (so the median in its title is a per-token
# statistic, a little different from the per-row medians printed above). In the buggy engine it is exactly 127 for
# every token, the int8 code limit (the assert above checks it): with the scales gone, what is left is the codes.
# Upstream measured K inflated x221 and V x24 on Gemma 4, each exactly 1 / true scale. `tiny-kvshare`'s factors
# are smaller (a few tens, printed above), because its true scales are larger, but the same law holds for every
# (token, head) row. Layers 4 and 5 then attend over these keys and values: every attention logit against a
# prompt key is multiplied by that key's inflation factor.
#
# **Which requests.** The buggy engine's requests as the scheduler batched them (rows are batches of
# `max_num_seqs`), green when the answer is right: only the first row is red.

# %%
assert [not ok for ok in right_buggy] == [i in damaged for i in range(len(prompts))]
viz.request_grid([not ok for ok in right_buggy], max_num_seqs=4, title="Buggy engine")

# %% [markdown]
# **minikv's own observation: prefix caching carries the damage further.** (Upstream called the apparent
# dependence on prefix caching spurious; this is not one of its symptoms.) With prefix caching on, a finished request's full blocks stay in
# the cache for later requests with the same prefix. If those blocks were written in the first batch, their
# target-layer scales are the wiped 1.0s, and a later request that reuses them reads the inflated K/V even
# though it was never in the first batch. To see it we need prompts longer than one block (16 tokens): 8 distinct
# 40-token prompts (two full blocks each), then the first four again.

# %%
distinct = list(dict.fromkeys(task.prompts(16, seed=1, num_tokens=40)))[:8]   # 8 different prompts
assert len(distinct) == 8
long_prompts = distinct + distinct[:4]
cached = {}


def record_prefix_hits(out):
    for r, n in out.num_cached_tokens.items():       # filled at prefill steps only
        cached.setdefault(r, n)


runs = {}
for buggy_run in (False, True):
    llm = engine(buggy=buggy_run, enable_prefix_caching=True)
    outs = serve(llm, long_prompts, params, record_prefix_hits)
    runs[buggy_run] = [o.text for o in outs]
    hits = [cached[o.request_id] for o in outs]
    print(f"{'buggy' if buggy_run else 'fixed'}: prefix-cache hits (tokens) per request {hits}; late fills: "
          f"{[(f.layer, f.step, f.overwritten) for f in llm.census.wiping]}")
    assert hits == [0] * 8 + [32] * 4
    assert [f.step for f in llm.census.wiping] == ([0, 0] if buggy_run else [])
    cached.clear()
prefix_damaged = [i for i, p in enumerate(long_prompts)
                  if runs[True][i] != runs[False][i] and not task.check(p, runs[True][i])]
print("fixed engine wrong:", ranges([i for i, p in enumerate(long_prompts) if not task.check(p, runs[False][i])]))
print("buggy engine damaged:", ranges(prefix_damaged))
assert all(task.check(p, t) for p, t in zip(long_prompts, runs[False]))
assert prefix_damaged == [0, 1, 2, 3, 8, 9, 10, 11]
viz.request_grid([not task.check(p, t) for p, t in zip(long_prompts, runs[True])], max_num_seqs=4,
                 title="Buggy, prefix caching")

# %% [markdown]
# Requests 8-11 ran in the third batch, long after the wipe, and are damaged anyway: each reused the two wiped
# blocks its twin wrote in the first batch. Requests 4-7 (the second batch, no shared prefix with the first)
# are fine.
#
# ## 6. The repro table
#
# `minikv repro scale-wipe` runs a buggy and a fixed engine per configuration and checks upstream's signatures.
# Here are its functions on a small set: both per-token-head formats, `max_num_seqs` 4 and 8, prefix caching off,
# 24 requests each, plus a float32 (`auto`) cache with and without the switch. "K infl" and "V infl" are the
# median measured inflations; the last column is the census (fills that wiped nothing | late fills and how many
# written scales each overwrote).

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
# `max_num_seqs=4`, 0-7 with 8); both int8 and fp8 per-token-head caches are hit; a cache without inline scales
# is untouched by the switch; the inflation equals 1 / true scale; and the census splits into harmless warmup
# fills and two late fills.
#
# ## 7. The fix, checked
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
# identical. With the historical code, layers 2 and 3 differ, and only in the scale bytes.

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
    serve(llm, prompt_list, minikv.SamplingParams(max_tokens=1), grab)
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
# **sleep() / wake_up() initializes every scale region again, in both sleep modes.** `sleep(mode="discard")` is
# vLLM's shape: the arena's storage stays at its address and the pools' contents are discarded (zeroed here).
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
# layers. A warmup that runs every layer with attention metadata, as CUDA-graph capture does
# (`warmup="capture"`), gives the sharing impls their first touch before anything is written, so the historical
# code wipes nothing.

# %%
capture = engine(buggy=True, warmup="capture")
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
# ## Summary
#
# * KV-sharing layers get their target's cache tensor itself, so per-impl state about "my cache" is really
#   per-impl state about someone else's storage.
# * The historical code filled a storage's inline scales with 1.0 on each impl's first touch. Warmup gives the
#   owning layers their first touch harmlessly; the sharing layers' first touch falls inside step 0, after the
#   prompt's scales are written, and resets them. The codes survive, so K and V come back inflated by exactly
#   1 / true scale, and exactly the first batch is wrong; a warmup that touches every layer hides it. In minikv,
#   prefix caching can hand the wiped blocks to later requests (minikv's observation, not upstream's). The wipe
#   happens once per engine start: the historical views outlive `sleep()`.
# * The fix fills once per storage (a registry keyed by address and size, with a weak reference to the storage
#   itself to notice a reused address). After it, outputs equal the float32 cache's, a request's KV bytes do not
#   depend on when it ran, and a woken-up engine initializes every scale region again in both sleep modes.
