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
# # 01 · The paged KV cache
#
# A decoder generates one token at a time, and every new token attends over all the tokens before it. The keys and
# values (K/V) of those earlier tokens do not change, so an inference engine computes them once and keeps them:
# each attention layer stores the K and V vectors of every token it has seen, and a step computes only the new
# token's K/V and attends over the stored ones. That store is the **KV cache**.
#
# The KV cache is the largest piece of memory an engine manages, and it grows by one token per step for every
# request in flight. How it is laid out decides how many requests fit on a device at once. This notebook builds up
# the layout minikv uses, the *paged* cache introduced by vLLM (PagedAttention), and checks each piece against the
# running code:
#
# 1. what a contiguous per-request cache wastes, measured on a batch of ragged requests;
# 2. blocks and **block tables**, recorded from a real engine run;
# 3. the **slot mapping**, which tells the write kernel where each new token's K/V goes;
# 4. **prefix caching**: requests that start alike share blocks, counted by reference counts;
# 5. the decode attention kernel reading K/V through a shuffled block table, against its reference and against
#    plain attention over contiguous tensors;
# 6. the whole engine answering with `tiny-gemma4`, a Gemma-4 text decoder trained to continue arithmetic sequences.
#
# Everything runs on CPU. The Triton kernels run in the Triton interpreter, which is slow, so the engine runs
# that only bookkeep use minikv's `torch` backend (the pure-PyTorch references of the kernels, with the same byte
# addressing), and sections 5 and 6 run the Triton kernels themselves.

# %% [markdown]
# **Where this fits.** First of six notebooks. The concept page
# [docs/concepts/paged-kv-cache.md](../docs/concepts/paged-kv-cache.md) tells the same story in prose, and terms
# such as *slot*, *block table* or *pool* are in the [glossary](../docs/glossary.md). Next:
# [02 · the quantized KV cache](02_quantized_kv_cache.ipynb); the defects that build on these pieces are in
# [03](03_kv_sharing_scale_wipe.ipynb) (vLLM's scale wipe) and [04](04_cross_attention_stride_doubling.ipynb)
# (TensorRT-LLM's cross-attention stride).

# %%
import torch

torch.set_num_threads(1)   # the tiny model's ops are too small to gain from threads on a CPU
torch.manual_seed(0)

# %matplotlib inline
import math
import os

# Run the Triton kernels in the Triton interpreter, on CPU tensors, even on a machine with a GPU, so that every
# output below is the same everywhere (minikv picks the mode when it is first imported).
os.environ.setdefault("TRITON_INTERPRET", "1")

import minikv
from minikv import kernels, viz
from minikv.cache.blocks import BlockManager
from minikv.cache.layout import KVLayout
from minikv.engine.sequence import Sequence
from minikv.models import registry
from minikv.repro.common import ranges

DEVICE = "cpu"
BLOCK_SIZE = 16
config = registry.model_config("tiny-gemma4")
tokenizer = registry.get_tokenizer("tiny-gemma4")
task = minikv.tasks.for_model("tiny-gemma4")
print(f"tiny-gemma4: {config.num_layers} layers, {config.num_heads} query heads, {config.num_kv_heads} KV heads "
      f"of size {config.head_size}, at most {config.max_position} tokens per sequence")
print("KV sharing (layer -> layer whose cache it reads):", config.kv_sharing)

# %% [markdown]
# ## 1. The contiguous cache, and what it wastes
#
# The simplest cache gives each request one region per layer, shaped `[max_len, kv_heads, head_size]` for K and
# the same for V, where `max_len` is the longest the request might become. An engine does not know in advance
# when a request will stop, so `max_len` is the model's maximum, 128 tokens for `tiny-gemma4`.
#
# How many bytes is one token? `KVLayout` is the one place in minikv that computes cache bytes. With the
# `auto` format the cache stores K and V in the model's dtype, float32 on CPU. `tiny-gemma4`'s layers 4 to 7
# read the caches of layers 2 and 3 (notebook 03 is about that), so only four of its eight layers own a cache.

# %%
owners = [i for i in range(config.num_layers) if i not in config.kv_sharing]
layout = KVLayout("auto", torch.float32, config.num_kv_heads, config.head_size, BLOCK_SIZE)
bytes_per_token = layout.bytes_per_token() * len(owners)
print(f"one token, one layer: K and V x {config.num_kv_heads} heads x {config.head_size} x 4 bytes = "
      f"{layout.bytes_per_token()} bytes; {len(owners)} owning layers {owners}: {bytes_per_token} bytes")


def contiguous_cache(num_requests, max_len):
    """The simplest KV cache: per owning layer, one [2 (K, V), requests, max_len, kv_heads, head_size] tensor."""
    return {i: torch.zeros(2, num_requests, max_len, config.num_kv_heads, config.head_size) for i in owners}


cache = contiguous_cache(16, config.max_position)
contiguous_bytes = sum(t.numel() * t.element_size() for t in cache.values())
print(f"contiguous cache for 16 requests of up to {config.max_position} tokens: {contiguous_bytes:,} bytes")
assert contiguous_bytes == 16 * config.max_position * bytes_per_token
del cache

# %% [markdown]
# Now a real batch: 16 arithmetic prompts of the held-out test set, each asking for 12 new tokens. Their lengths
# are ragged, as requests are. We run them through minikv's engine with all 16 in flight at once
# (`max_num_seqs=16`), driving it one `step()` at a time and recording from each step's `StepOutput` how many tokens of each request have their
# K/V in the cache and how many blocks the engine's block manager gives it (blocks are the subject of section 2;
# here it is enough that a block holds 16 tokens).

# %%
prompts = task.prompts(16, seed=0)
params = minikv.SamplingParams(temperature=0, max_tokens=12)
llm = minikv.LLM(model="tiny-gemma4", max_num_seqs=16, device=DEVICE, backend="torch")
cached_tokens, blocks_held, blocks_in_use = {}, {}, []


ids = [llm.add_request(p, params) for p in prompts]
finished = {}
while llm.has_unfinished():
    out = llm.step()
    for rid in out.request_ids:
        cached_tokens[rid] = out.seq_lens[rid]              # every token of the request has its K/V written now
        blocks_held[rid] = len(out.block_tables[rid])       # (taken before finished requests free their blocks)
    blocks_in_use.append(sum(len(t) for t in out.block_tables.values()))
    finished.update({o.request_id: o for o in out.finished})
outs = [finished[i] for i in ids]
lengths = [cached_tokens[o.request_id] for o in outs]
blocks = [blocks_held[o.request_id] for o in outs]
print("prompt tokens (with BOS):", [len(p) + 1 for p in prompts])
print("tokens in the cache at the end:", lengths)
print("blocks held at the end:        ", blocks)
print("all answers right:", all(task.check(p, o.text) for p, o in zip(prompts, outs)))
assert blocks == [math.ceil(n / BLOCK_SIZE) for n in lengths]
assert lengths == [len(p) + 1 + params.max_tokens - 1 for p in prompts]
assert all(task.check(p, o.text) for p, o in zip(prompts, outs))

# %% [markdown]
# A request's last generated token is sampled but never fed back, so its K/V is never written: the cache ends
# with `prompt + 11` tokens per request. Each request holds exactly `ceil(tokens / 16)` blocks, so at most 15
# slots of its last block are unused.
#
# The contiguous cache reserves 128 slots for each request no matter what. The figure puts the two side by side:
# grey is the contiguous reservation, orange the paged one, and blue the slots actually used.

# %%
used = sum(lengths)
paged_slots = BLOCK_SIZE * sum(blocks)
contiguous_slots = config.max_position * len(prompts)
print(f"{'':24s} {'slots':>6s} {'bytes':>10s} {'wasted bytes':>13s} {'wasted':>7s}")
rows = (("used", used), ("paged (16-token blocks)", paged_slots), ("contiguous (128 each)", contiguous_slots))
for name, slots in rows:
    waste = slots - used
    print(f"{name:24s} {slots:6d} {slots * bytes_per_token:10,} {waste * bytes_per_token:13,} "
          f"{waste / slots:7.1%}")
print(f"peak blocks in use during the run: {max(blocks_in_use)} = {max(blocks_in_use) * BLOCK_SIZE} slots")
print(f"the contiguous reservation would hold these requests' blocks "
      f"{contiguous_slots / paged_slots:.2f} times over")
assert max(blocks_in_use) == sum(blocks)   # every request was in flight until the last step
assert (paged_slots - used) < BLOCK_SIZE * len(prompts) and (contiguous_slots - used) / contiguous_slots > 0.5
viz.fragmentation_plot(lengths, BLOCK_SIZE, config.max_position,
                       title="16 ragged requests: KV slots reserved per request")

# %% [markdown]
# More than half of the contiguous reservation is never used, while the paged cache loses only the tails of last
# blocks. Turned around: the memory the contiguous layout needs for these 16 requests would hold almost twice as
# many of them if it were handed out in blocks.
#
# The block size is a trade-off. Smaller blocks waste less at the tail, but each request needs more block-table
# entries, and the attention kernel follows one table entry per block, so it reads K/V in smaller pieces.

# %%
print(f"{'block size':>10s} {'blocks':>7s} {'wasted slots':>13s} {'wasted':>7s} {'longest table':>14s}")
for size in (8, 16, 32, 64):
    per_request = [math.ceil(n / size) for n in lengths]
    waste = size * sum(per_request) - used
    print(f"{size:10d} {sum(per_request):7d} {waste:13d} {waste / (size * sum(per_request)):7.1%} "
          f"{max(per_request):14d}")

# %% [markdown]
# ## 2. Blocks and block tables
#
# A paged cache cuts each layer's cache into **blocks** of `block_size` token slots (16 here) and hands them out
# as requests grow, the way an operating system hands out pages of memory. A request's **block table** lists its
# blocks in token order, so token `i` of the request lives in
#
# ```
# block  = block_table[i // block_size]
# offset = i % block_size
# ```
#
# One block id indexes every layer's cache, so one table serves the whole model. Blocks need not be adjacent, or
# in order: a request takes whichever block is free when it needs one. minikv's `BlockManager` always takes the
# lowest free id, which makes every run repeatable.
#
# To watch tables grow, we run four prompts whose lengths are chosen so that some requests cross a block boundary
# while they decode: 14, 21, 9 and 30 tokens with BOS, each generating 12 tokens. After every step the hook
# prints the tables that changed.

# %%
lengths_with_bos = (14, 21, 9, 30)
small_prompts = [task.prompts(1, seed=1, num_tokens=n)[0] for n in lengths_with_bos]
llm = minikv.LLM(model="tiny-gemma4", max_num_seqs=4, device=DEVICE, backend="torch")
history = []                   # per step: (step, prefill?, {request: block table}, the StepOutput)
ids = [llm.add_request(p, params) for p in small_prompts]
finished = {}
while llm.has_unfinished():
    out = llm.step()
    tables = {r: list(t) for r, t in out.block_tables.items()}
    if not history or tables != history[-1][2]:
        print(f"step {out.step:2d} ({out.phase:7s}) lengths {list(out.seq_lens.values())}: block tables {tables}")
    history.append((out.step, out.is_prefill, tables, out))
    finished.update({o.request_id: o for o in out.finished})
small_outs = [finished[i] for i in ids]
for p, o in zip(small_prompts, small_outs):
    print(f"{p!r:>40s} -> {o.text!r}")
final_tables = history[-1][2]
print("lengths at the last step:", list(history[-1][3].seq_lens.values()))
assert final_tables == {0: [0, 6], 1: [1, 2], 2: [3, 8], 3: [4, 5, 7]}
assert all(task.check(p, o.text) for p, o in zip(small_prompts, small_outs))

# %% [markdown]
# At the prefill step the four requests took blocks 0 to 5, lowest first: one, two, one and two blocks. At step 3,
# requests 0 and 3 reached tokens 16 and 32, each the first token of a new block, and took blocks 6 and 7; request
# 2 took block 8 at step 8. Request 1 ends at exactly 32 tokens and never needs a third block. The final tables
# interleave the requests' blocks, which a contiguous layout could not do:

# %%
viz.block_table_diagram({f"request {r}": t for r, t in final_tables.items()}, num_blocks=12,
                        title="Block tables after the last step")

# %% [markdown]
# ## 3. The slot mapping
#
# The kernels never see requests. A step hands them a flat batch of new tokens, all requests' tokens one after
# another, and for writing, a **slot mapping**: for each new token, the global cache slot
# `block * block_size + offset` that its K and V go to. The model runner builds it from the block tables before
# each step (`ModelRunner.prepare`). A slot of -1 means "write nothing"; the warmup step at start-up uses it for
# every token.
#
# Each `StepOutput` above carries the step's slot mapping, per request. Here is the prefill step's, with each
# slot checked against the formula.

# %%
prefill = history[0][3]
slots = [s for r in prefill.request_ids for s in prefill.slot_mapping[r]]
starts = [0]
for r in prefill.request_ids:
    starts.append(starts[-1] + len(prefill.slot_mapping[r]))
print("prefill: query_start_loc", starts, " seq_lens", list(prefill.seq_lens.values()))
for r, (a, b) in enumerate(zip(starts, starts[1:])):
    print(f"  request {r}: tokens {a}-{b - 1} of the batch -> slots {ranges(slots[a:b])}")
expected = [final_tables[r][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
            for r, n in enumerate(lengths_with_bos) for p in range(n)]
assert slots == expected
labels = [c if c != " " else "·" for p in small_prompts for c in "B" + p]   # B: BOS, ·: a space
token_requests = [r for r, (a, b) in enumerate(zip(starts, starts[1:])) for _ in range(a, b)]
viz.slot_mapping_diagram(torch.tensor(slots), BLOCK_SIZE, token_labels=labels, requests=token_requests,
                         key="a cell's label: the prompt character whose K/V is written there (B: the BOS token, "
                             "·: a space)",
                         title="Prefill: where each prompt character's K/V is written")

# %% [markdown]
# Each request's characters fill its blocks from offset 0; request 1's 21 tokens run from block 1 into block 2,
# request 3's 30 tokens from block 4 into block 5. At a decode step there is one new token per request, the one
# whose K/V is computed in that step (the token sampled in the step before):

# %%
crossing = next(i for i, (_, pre, tables, _) in enumerate(history) if not pre and tables != history[i - 1][2])
decode = history[crossing][3]
decode_slots = [decode.slot_mapping[r][0] for r in decode.request_ids]
decode_lens = [decode.seq_lens[r] for r in decode.request_ids]
print(f"step {crossing}: seq_lens {decode_lens}, slot mapping {decode_slots}")
for r, slot in enumerate(decode_slots):
    position = decode_lens[r] - 1
    print(f"  request {r}: token {position:2d} -> block {slot // BLOCK_SIZE}, offset {slot % BLOCK_SIZE}")
assert [s % BLOCK_SIZE for s in decode_slots] == [(n - 1) % BLOCK_SIZE for n in decode_lens]
viz.slot_mapping_diagram(torch.tensor(decode_slots), BLOCK_SIZE, token_labels=[f"r{r}" for r in range(4)],
                         requests=list(range(4)), key="a cell's label: the request whose new token is written there",
                         title=f"Decode step {crossing}: one new token per request")

# %% [markdown]
# Requests 0 and 3 write their token 16 and 32 at offset 0 of the blocks they just took, 6 and 7. For reading, the
# attention kernels get the block tables themselves (padded into a 2-D tensor) and each request's length, and
# walk a request's blocks in order (section 5).
#
# ## 4. Prefix caching: sharing blocks
#
# Requests often start alike: a system prompt, a few-shot preamble, a document asked about twice. Their K/V for
# the common start are identical, so they can share the blocks that hold it. minikv does this on **full blocks**
# only. A full block is identified by a **chained hash** that covers the hash of the block before it and its own
# token ids, so two requests share a block only when *every* token up to the end of that block is the same. Each
# block carries a **reference count**, the number of requests using it.
#
# We drive a `BlockManager` with prefix caching by hand. Request A is the first 14 terms of 3, 7, 11, 15, ...
# (40 tokens with BOS); request B is the first 19 terms (55 tokens), so its first 40 tokens are A's.

# %%
text_a = " ".join(str(3 + 4 * i) for i in range(14))
text_b = " ".join(str(3 + 4 * i) for i in range(19))
assert text_b.startswith(text_a) and (len(text_a) + 1, len(text_b) + 1) == (40, 55)


def make_sequence(request_id, text):
    return Sequence(request_id, text, [tokenizer.bos_id] + tokenizer.encode(text))


manager = BlockManager(num_blocks=10, block_size=BLOCK_SIZE, enable_prefix_caching=True)
seq_a, seq_b = make_sequence(0, text_a), make_sequence(1, text_b)
manager.allocate(seq_a)
manager.allocate(seq_b)
for seq in (seq_a, seq_b):
    print(f"{'AB'[seq.request_id]}: {len(seq)} tokens, block table {seq.block_table}, "
          f"tokens found in the cache {seq.num_cached_tokens}")
print("hit blocks so far:", manager.num_hit_blocks)
print("reference counts:", {b: manager.ref_count(b) for b in range(6)})
assert seq_b.block_table[:2] == seq_a.block_table[:2] and manager.num_hit_blocks == 2
assert [manager.ref_count(b) for b in range(5)] == [2, 2, 1, 1, 1]
viz.block_table_diagram({"A (40 tokens)": seq_a.block_table, "B (55 tokens)": seq_b.block_table}, num_blocks=10,
                        title="Prefix caching: B reuses A's two full blocks")

# %% [markdown]
# A's 40 tokens fill blocks 0 and 1 and 8 slots of block 2. B's first 32 tokens hash to the same two full blocks,
# so B takes them (reference count 2) and gets fresh blocks only for the rest. Block 2 is not shared even though
# B's tokens 32 to 39 equal A's: a partly filled block has no hash, because its content is not final.
#
# When a request finishes, its blocks' counts drop. A block that reaches zero but holds a registered prefix stays
# **cached-free**: it can be handed out again, but until then a later request with the same prefix can revive it.

# %%
manager.deallocate(seq_a)
print("after A finishes: reference counts", {b: manager.ref_count(b) for b in range(5)})
manager.deallocate(seq_b)
print("after B finishes: cached-free blocks", manager.cached_free_block_ids(), "free blocks",
      manager.num_free_blocks)
seq_c = make_sequence(2, text_a[:-1] + "9")          # A with its last digit changed
manager.allocate(seq_c)
print(f"C (A with a different last digit): block table {seq_c.block_table}, "
      f"cached tokens {seq_c.num_cached_tokens}")
seq_d = make_sequence(3, "9" + text_a[1:])           # A with its first digit changed
manager.allocate(seq_d)
print(f"D (A with a different first digit): block table {seq_d.block_table}, "
      f"cached tokens {seq_d.num_cached_tokens}")
assert seq_c.block_table[:2] == [0, 1] and seq_c.num_cached_tokens == 32
assert seq_d.num_cached_tokens == 0 and not set(seq_d.block_table) & {0, 1}

# %% [markdown]
# C differs from A only in its last token, so it revives A's two full blocks. D differs from A only in its first
# digit, so even its second block, whose 16 tokens are the same as A's, does not match: the hash chain carries the
# first block's difference into every later block. That is what makes sharing safe, because a token's K/V depend on every token
# before it.
#
# The engine does the same with `enable_prefix_caching=True`. We serve A, then B in a second call, and count the
# prompt tokens each prefill actually computed. B's answer must not change: we compare it with an engine that has
# prefix caching off.

# %%
computed = {}


def serve_one(engine, text):
    """Run one request step by step; record how many prompt tokens its prefill computed and found cached."""
    rid = engine.add_request(text, params)
    while engine.has_unfinished():
        out = engine.step()
        if out.is_prefill:
            cached = out.num_cached_tokens[rid]
            computed[text] = (out.seq_lens[rid] - cached, cached)
        if out.finished:
            return out.finished[0]


runs = {}
for caching in (False, True):
    engine = minikv.LLM(model="tiny-gemma4", max_num_seqs=4, device=DEVICE, backend="torch",
                        enable_prefix_caching=caching)
    runs[caching] = [serve_one(engine, text) for text in (text_a, text_b)]
    print(f"prefix caching {'on ' if caching else 'off'}: hit blocks {engine.block_manager.num_hit_blocks}; "
          + "; ".join(f"{'AB'[i]} computed {computed[t][0]} tokens, found {computed[t][1]} in the cache"
                      for i, t in enumerate((text_a, text_b))))
for out in runs[True]:
    print(f"{out.prompt[-20:]!r:>24s} -> {out.text!r}  right: {task.check(out.prompt, out.text)}")
assert computed[text_a] == (40, 0) and computed[text_b] == (55 - 48, 48)
assert [o.token_ids for o in runs[True]] == [o.token_ids for o in runs[False]]
assert all(task.check(o.prompt, o.text) for o in runs[True])

# %% [markdown]
# With caching on, B's prefill computed only 7 of its 55 tokens and found 48 in the cache: three blocks, one more
# than in the hand-driven example. A's two full prompt blocks are the first two. The third is the block A's
# *decode* filled: A's prompt ends at token 40, its answer ' 59 63 67 71' carried it past token 48, and the block
# manager registers a block the moment a decode step fills it. A's answer is exactly how B's prompt goes on, so
# B's tokens 32 to 47 match that block too. (B's last token is always computed, since its logits give the first
# new token, so 48 is the most B could find.) All three blocks had stayed cached-free after A finished, and the
# answers are token for token the same as without caching.
#
# ## 5. The decode kernel reads through the block table
#
# At a decode step each request has one new query token, which attends over all of the request's cached tokens.
# `minikv.kernels.paged_decode_attention` runs one program per (request, KV head). A program walks its request's
# tokens in tiles; for each token it looks up `block_table[token // block_size]`, adds the offset, and loads that
# row of K (and of V). So the kernel reads scattered blocks exactly as it would read a contiguous tensor, and
# nothing in its arithmetic depends on where the blocks are.
#
# To check that, we fill a pool through the write kernel with random K/V for three requests whose blocks are
# handed out in a *shuffled* order, run the decode kernel (Triton, in the interpreter), and compare it with its
# pure-PyTorch reference and with plain softmax attention over the same K/V stored contiguously.

# %%
gen = torch.Generator().manual_seed(0)
num_blocks = 12
request_lens = [7, 40, 23]
needed = [math.ceil(n / BLOCK_SIZE) for n in request_lens]
order = torch.randperm(num_blocks, generator=gen).tolist()
tables, taken = [], 0
for n in needed:
    tables.append(order[taken:taken + n])
    taken += n
print("shuffled block tables:", tables)

pool = torch.zeros(layout.pool_bytes(num_blocks), dtype=torch.uint8)
keys = [torch.randn(n, config.num_kv_heads, config.head_size, generator=gen) for n in request_lens]
values = [torch.randn(n, config.num_kv_heads, config.head_size, generator=gen) for n in request_lens]
slot_mapping = torch.tensor([t[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                             for t, n in zip(tables, request_lens) for p in range(n)])
kernels.write_kv(torch.cat(keys), torch.cat(values), pool, slot_mapping, layout)

width = max(needed)
block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
seq_lens = torch.tensor(request_lens, dtype=torch.int32)
q = torch.randn(len(request_lens), config.num_heads, config.head_size, generator=gen)
sm_scale = config.head_size ** -0.5
out = kernels.paged_decode_attention(q, pool, block_tables, seq_lens, layout, sm_scale)
out_reference = kernels.paged_decode_attention_reference(q, pool, block_tables, seq_lens, layout, sm_scale)


def order_of(diff):
    """'<= 1e-06'-style bound on max |diff|, so the printed line does not depend on the last bits of float math."""
    worst = diff.abs().max().item()
    return "0" if worst == 0 else f"<= 1e{math.ceil(math.log10(worst)):+03d}"


def dense_attention(q, k, v):
    """Plain softmax attention of one query token [heads, D] over contiguous k, v [n, kv_heads, D] (GQA)."""
    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    weights = torch.softmax(torch.einsum("hd,nhd->hn", q, k) * sm_scale, dim=-1)
    return torch.einsum("hn,nhd->hd", weights, v)


out_dense = torch.stack([dense_attention(q[b], keys[b], values[b]) for b in range(len(request_lens))])
print(f"Triton kernel vs reference:            max |diff| {order_of(out - out_reference)}")
print(f"Triton kernel vs contiguous attention: max |diff| {order_of(out - out_dense)}")
assert torch.allclose(out, out_reference, atol=1e-5, rtol=1e-5)
assert torch.allclose(out, out_dense, atol=1e-5, rtol=1e-5)
viz.block_table_diagram({f"request {b} ({n} tokens)": t for b, (t, n) in enumerate(zip(tables, request_lens))},
                        num_blocks=num_blocks, title="Shuffled block tables read by the decode kernel")

# %% [markdown]
# The kernel really follows the table. Attention over a set of tokens does not depend on their order, so
# swapping two of a request's full blocks would prove nothing. Instead we point request 1's second table entry at
# request 2's first block: request 1 now reads 16 of request 2's tokens in place of its own, and only its output
# changes.

# %%
wrong_tables = block_tables.clone()
wrong_tables[1, 1] = block_tables[2, 0]
out_wrong = kernels.paged_decode_attention(q, pool, wrong_tables, seq_lens, layout, sm_scale)
for b in range(len(request_lens)):
    print(f"request {b}: table {wrong_tables[b, :needed[b]].tolist()}, "
          f"max |diff| from contiguous attention {(out_wrong[b] - out_dense[b]).abs().max():.1f}")
assert torch.allclose(out_wrong[[0, 2]], out_dense[[0, 2]], atol=1e-5, rtol=1e-5)
assert not torch.allclose(out_wrong[1], out_dense[1], atol=1e-2)

# %% [markdown]
# ## 6. The engine
#
# The pieces together: `minikv.LLM` with the `triton` backend allocates the pools in a KV arena, and each step the
# scheduler's block manager extends the block tables, the runner builds the slot mapping and block-table tensors,
# the write kernel stores the new K/V, and the attention kernels read through the tables. Two prompts, one short
# and one spanning three blocks, 12 new tokens each. `tiny-gemma4` was trained to continue arithmetic
# sequences, so each answer is right or wrong; we also check that the Triton kernels give the same tokens as the
# `torch` backend.

# %%
engine_prompts = ["3 7 11 15", task.prompts(1, seed=2, num_tokens=40)[0]]
by_backend = {}
for backend in ("triton", "torch"):
    engine = minikv.LLM(model="tiny-gemma4", max_num_seqs=4, device=DEVICE, backend=backend)
    by_backend[backend] = engine.generate(engine_prompts, params, use_tqdm=False)
for p, o in zip(engine_prompts, by_backend["triton"]):
    print(f"{p!r} -> {o.text!r}  right: {task.check(p, o.text)}")
assert by_backend["triton"][0].text == " 19 23 27 31"
assert all(task.check(p, o.text) for p, o in zip(engine_prompts, by_backend["triton"]))
assert [o.token_ids for o in by_backend["triton"]] == [o.token_ids for o in by_backend["torch"]]

# %% [markdown]
# ## Summary
#
# * A contiguous cache reserves the longest possible sequence for every request; on 16 ragged requests more than
#   half of it stayed unused. A paged cache hands out 16-token blocks as requests grow and wastes at most the tail
#   of each request's last block.
# * A block table maps a request's token positions to physical blocks, which need not be adjacent. Before each
#   step the runner flattens the tables into a slot mapping for the write kernel; the attention kernels read
#   through the tables themselves.
# * Prefix caching shares full blocks between requests with a common start, identified by a chained hash and
#   counted by reference counts; freed blocks stay revivable until the pool needs them. Outputs do not change.
# * The decode kernel gives the same result through a shuffled block table as plain attention over contiguous
#   K/V, and the engine built from these parts answers correctly.
#
# The next notebook stores the cache in 8 bits per element, with a scale per token and head kept inline in each
# cache row.

# %% [markdown]
# ## Try it yourself
#
# Two exercises, in the style of Sebastian Raschka's *LLMs from scratch*: think first, then let the engine tell you.
# Each has three cells. Put your answer into the first one (replace `None`) and run it; the second runs the engine,
# computes the true answer and says whether yours is right, without printing it; the third is the worked solution,
# folded (in JupyterLab, click the bar left of it to unfold the code and its output; on the docs site, click
# "Solution"). The notebook tests run all three, with no answer filled in.
#
# **Exercise 1: a smaller block.** Section 2's four requests (14, 21, 9 and 30 tokens with BOS, 12 new tokens
# each) end with 25, 32, 20 and 41 tokens in the cache. An engine with `block_size=8` instead of 16 serves the same
# requests. How many blocks does each request hold at the last step?

# %% tags=["exercise"]
my_answer_1 = None          # your answer: a list of four numbers, one per request

# %% tags=["check"]
from minikv.viz.exercises import check

small_blocks = minikv.LLM(model="tiny-gemma4", max_num_seqs=4, device=DEVICE, backend="torch", block_size=8)
small_ids = [small_blocks.add_request(p, params) for p in small_prompts]
while small_blocks.has_unfinished():
    last = small_blocks.step()
    held = {r: len(t) for r, t in last.block_tables.items()}
check("Exercise 1", my_answer_1, [held[r] for r in small_ids])

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: ceil(tokens / 8) per request. Halving the block halves the largest possible tail (7 slots instead
# of 15), and doubles the number of block-table entries the attention kernel follows.
final_lens = list(last.seq_lens.values())
assert final_lens == [25, 32, 20, 41]
answer_1 = [math.ceil(n / 8) for n in final_lens]
assert [held[r] for r in small_ids] == answer_1
print("answer:", answer_1)

# %% [markdown]
# **Exercise 2: where the prefixes part.** Request E is B's prompt from section 4 with the 9th term changed from
# 35 to 36, one character in B's second block. With prefix caching, how many of E's tokens does the block manager
# find already cached after A and B ran (and were freed) in the hand-driven example?

# %% tags=["exercise"]
my_answer_2 = None          # your answer: a number of tokens

# %% tags=["check"]
text_e = text_b.replace(" 35 ", " 36 ")
changed = text_e.index(" 36 ") + 3                       # the changed digit's token (BOS is token 0)
assert BLOCK_SIZE <= changed < 2 * BLOCK_SIZE and text_e[changed - 1] != text_b[changed - 1]
seq_e = make_sequence(4, text_e)
manager.allocate(seq_e)
check("Exercise 2", my_answer_2, seq_e.num_cached_tokens)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: one block. Block 0 (BOS and tokens 1-15) is A's and B's first block, unchanged; block 1 holds the
# changed character, so its chained hash differs, and so does every later block's, even where the characters
# agree again.
assert seq_e.num_cached_tokens == BLOCK_SIZE and seq_e.block_table[0] == 0
print("answer:", seq_e.num_cached_tokens, "tokens (block 0 only)")
