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
# # 02 · The quantized KV cache and inline scales
#
# The previous notebook made the KV cache waste less. This one makes each token cost less: store K and V in
# 8 bits per element instead of the model's 16 or 32, and twice (or four times) as many tokens fit in the same
# memory. The price is rounding error, and how the **scales** are chosen decides how much.
#
# minikv has four cache formats, `kv_cache_dtype`, named as in vLLM:
#
# | name | element | scales |
# |---|---|---|
# | `auto` | the model dtype | none |
# | `fp8` | float8 e4m3 | one fp32 scale per layer for K and one for V (TensorRT-LLM and vLLM `fp8`) |
# | `int8_per_token_head` | int8 | one fp32 scale per (token, KV head), for K and for V, stored *inline* |
# | `fp8_per_token_head` | float8 e4m3 | the same |
#
# For the per-token-head formats, each head vector `x` (one token, one KV head, `head_size` values) is stored as
#
# ```
# scale = max(amax(|x|) / QMAX, eps)          QMAX = 127 for int8, 448 for e4m3
# code  = clamp(round(x / scale))             round half to even; the clamp is explicit
# x_hat = code * scale                        what attention reads back
# ```
#
# and the fp32 scale sits right after the codes, in the same cache row. We go through:
#
# 1. what each format costs per token, from `KVLayout`;
# 2. the bytes of one cache row, read back by hand;
# 3. per-token-head versus per-tensor scales, on real K/V captured from `tiny-gemma4`;
# 4. the write kernel, stepped through program by program in the Triton interpreter;
# 5. fp8 rounding, bit-exact against torch over every finite float16 value.
#
# Everything runs on CPU; the Triton kernels run in the Triton interpreter on small inputs, and the engine runs use
# minikv's `torch` backend (the kernels' pure-PyTorch references, same bytes).

# %% [markdown]
# **Where this fits.** Previous: [01 · the paged KV cache](01_paged_kv_cache.ipynb). Concept page:
# [docs/concepts/kv-cache-formats.md](../docs/concepts/kv-cache-formats.md); terms (*amax*, *e4m3*, *row*, *inline
# scale*) in the [glossary](../docs/glossary.md). The inline scales built here are what vLLM's defect wipes
# ([03](03_kv_sharing_scale_wipe.ipynb); the fix proposed in vLLM pull request
# [#51091](https://github.com/vllm-project/vllm/pull/51091)), and the 1-byte element size is what
# TensorRT-LLM's cross stride got wrong ([04](04_cross_attention_stride_doubling.ipynb);
# [PR #20958](https://github.com/NVIDIA/TensorRT-LLM/pull/20958)).

# %%
import torch

torch.set_num_threads(1)   # the tiny model's ops are too small to gain from threads on a CPU
torch.manual_seed(0)

# %matplotlib inline
import inspect
import os
import struct

# Run the Triton kernels in the Triton interpreter, on CPU tensors, even on a machine with a GPU, so that every
# output below is the same everywhere (minikv picks the mode when it is first imported).
os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

import minikv
from minikv import kernels, viz
from minikv.cache.layout import KVLayout
from minikv.config import KV_CACHE_DTYPES
from minikv.models import registry

cache_write, launch, addressing, quant = kernels.cache_write, kernels.launch, kernels.addressing, kernels.quant

DEVICE = "cpu"
BLOCK_SIZE = 16
config = registry.model_config("tiny-gemma4")
task = minikv.tasks.for_model("tiny-gemma4")
owners = [i for i in range(config.num_layers) if i not in config.kv_sharing]


def layout_of(fmt, model_dtype=torch.float32, num_kv_heads=config.num_kv_heads, head_size=config.head_size):
    return KVLayout(fmt, model_dtype, num_kv_heads, head_size, BLOCK_SIZE)


print(f"tiny-gemma4: {config.num_kv_heads} KV heads of size {config.head_size}; layers owning a cache: {owners}")

# %% [markdown]
# ## 1. What a token costs
#
# `KVLayout` is the one place in minikv that computes cache bytes. For each format it knows the element type,
# the bytes per element, and whether a row carries an inline scale. A token costs one row per KV head for K and
# as many for V, in every layer that owns a cache.

# %%
print(f"{'format':22s} {'element':>18s} {'bytes':>5s} {'scales':>34s} {'row':>4s} {'token/layer':>11s}")
for fmt in KV_CACHE_DTYPES:
    lay = layout_of(fmt)
    scales = ("fp32 per (token, head), inline" if lay.has_inline_scales
              else "fp32 per layer, outside the pool" if lay.has_layer_scales else "none")
    print(f"{fmt:22s} {lay.code_dtype!s:>18s} {lay.elem_bytes:5d} {scales:>34s} {lay.row_bytes:4d} "
          f"{lay.bytes_per_token():11d}")

# %% [markdown]
# On CPU `tiny-gemma4` runs in float32, so `auto` stores 4 bytes per element; on a GPU it runs in bfloat16. The
# inline scale adds 4 bytes to each row of `head_size` codes: an eighth more for `tiny-gemma4`'s head size of 32,
# a thirty-second more for the head size of 128 that most large models use. Here is the whole model's cost per token on
# CPU and on GPU, and, for scale, the same for a large model's KV shape (32 layers, 8 KV heads of size 128, in
# bfloat16: Llama-3-8B's shape).

# %%
shapes = {
    "tiny-gemma4, float32 (CPU)": (torch.float32, config.num_kv_heads, config.head_size, len(owners)),
    "tiny-gemma4, bfloat16 (GPU)": (torch.bfloat16, config.num_kv_heads, config.head_size, len(owners)),
    "32 layers x 8 x 128, bfloat16": (torch.bfloat16, 8, 128, 32),
}
print(f"{'bytes per token':30s}" + "".join(f"{fmt:>22s}" for fmt in KV_CACHE_DTYPES))
memory = {}
for label, (dtype, heads, size, layers) in shapes.items():
    per_token = {fmt: layout_of(fmt, dtype, heads, size).bytes_per_token() * layers for fmt in KV_CACHE_DTYPES}
    memory[label] = per_token
    print(f"{label:30s}" + "".join(f"{per_token[f]:>13,} ({per_token[f] / per_token['auto']:5.1%})"
                                   for f in KV_CACHE_DTYPES))
assert memory["tiny-gemma4, bfloat16 (GPU)"]["int8_per_token_head"] == 4 * 2 * 2 * (32 + 4)
assert memory["32 layers x 8 x 128, bfloat16"]["fp8"] * 2 == memory["32 layers x 8 x 128, bfloat16"]["auto"]

# %% [markdown]
# Against a 16-bit cache, the per-layer `fp8` format halves the memory exactly; the per-token-head formats pay
# for their scales, 56.2% of `auto` at head size 32 and 51.6% at head size 128. What the scales buy is section 3.
#
# ## 2. One cache row, byte by byte
#
# A pool is a run of blocks; a block holds 16 slots of K, then 16 slots of V; a slot holds one row per KV head;
# and a row, in the per-token-head formats, is `head_size` one-byte codes followed by a 4-byte fp32 scale.
# `viz.row_layout_diagram` draws the three levels from a layout; the per-layer `fp8` format, for contrast, has no
# scale in its rows.

# %%
int8_layout = layout_of("int8_per_token_head")
print(f"int8_per_token_head: row {int8_layout.row_bytes} B (scale at byte {int8_layout.scale_offset}), "
      f"slot {int8_layout.slot_bytes} B, half block {int8_layout.kv_bytes} B, block {int8_layout.block_bytes} B")
viz.row_layout_diagram(int8_layout)

# %%
viz.row_layout_diagram(layout_of("fp8"))

# %% [markdown]
# To read a row by hand we need real keys. We run 8 prompts through an engine with the `auto` cache (float32, so
# the cache holds K and V exactly as the model computed them), one `step()` at a time, and after the prefill
# step copy every prompt token's K and V out of each pool the step wrote with `KVLayout.code_views`: views
# `[blocks, block_size, kv_heads, head_size]` over the pool's bytes, indexed by each token's block and offset.
# These are the K/V after Gemma-4's key and value norms and the rotary embedding, exactly what attention reads.

# %%
prompts = task.prompts(8, seed=3)
params = minikv.SamplingParams(temperature=0, max_tokens=12)
captured = {}


def prompt_slots(step):
    """The cache slots of every prompt token of a prefill step's requests, in batch order."""
    return torch.tensor([s for r in step.request_ids for s in step.block_slots(r, BLOCK_SIZE)])


auto_engine = minikv.LLM(model="tiny-gemma4", max_num_seqs=8, device=DEVICE, backend="torch")
ids = [auto_engine.add_request(p, params) for p in prompts]
done = {}
while auto_engine.has_unfinished():
    step = auto_engine.step()
    if step.is_prefill:
        blocks, offsets = prompt_slots(step) // BLOCK_SIZE, prompt_slots(step) % BLOCK_SIZE
        for pool in step.trace.pools_written():           # "kv.model.layers.N.self_attn": the KV-owning layers
            k_view, v_view = auto_engine.arena.layout(pool).code_views(auto_engine.arena.pool(pool))
            captured[int(pool.split(".")[3])] = (k_view[blocks, offsets].clone(), v_view[blocks, offsets].clone())
    done.update({o.request_id: o for o in step.finished})
auto_outs = [done[i] for i in ids]
k0, v0 = captured[0]
print(f"captured layers {sorted(captured)}; layer 0 K and V: {tuple(k0.shape)} "
      "(prompt tokens, kv heads, head size)")
assert sorted(captured) == owners and k0.shape[0] == sum(len(p) + 1 for p in prompts)

# %% [markdown]
# Now write one of those keys, token 1 of the first prompt, into a fresh one-block `int8_per_token_head` pool at
# slot 5 with the write kernel, and read the 36 bytes of its K row for head 0 straight out of the pool. We first
# round the key to bfloat16 precision (what a GPU run would hold anyway): the model's float32 arithmetic differs in
# the last bits from one CPU to another, and the exact bytes below should be the same on every machine.

# %%
key = k0[1:2].to(torch.bfloat16).float()       # [1 token, 2 kv heads, 32]
pool = torch.zeros(int8_layout.pool_bytes(1), dtype=torch.uint8)
kernels.write_kv(key, key.clone(), pool, torch.tensor([5]), int8_layout)
start = int8_layout.row_offset(block=0, kv=0, slot_in_block=5, head=0)
row = pool[start:start + int8_layout.row_bytes].tolist()
print(f"row at byte {start} of the pool:")
print("  codes:", " ".join(f"{b:02x}" for b in row[:32]))
print("  scale:", " ".join(f"{b:02x}" for b in row[32:]))

# %% [markdown]
# The first 32 bytes are int8 codes in two's complement: a byte `b` of 128 or more stands for `b - 256`. The last
# four are the scale, a little-endian IEEE float32: one sign bit, eight exponent bits with bias 127, and 23
# mantissa bits with an implicit leading 1. Decoding both by hand, with nothing but integer arithmetic:

# %%
codes = [b - 256 if b >= 128 else b for b in row[:32]]
bits = int.from_bytes(bytes(row[32:]), "little")
sign, exponent, mantissa = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
scale = (-1) ** sign * (1 + mantissa / 2**23) * 2.0 ** (exponent - 127)
x = key[0, 0]
print("codes by hand:", codes)
print(f"scale bits 0x{bits:08x}: sign {sign}, exponent {exponent} (2^{exponent - 127}), mantissa 0x{mantissa:06x}"
      f" -> {scale!r}")
print(f"amax(|x|) / 127 in float32: {(x.abs().max() / 127).item()!r}")
largest = max(range(32), key=lambda i: abs(codes[i]))
print(f"element {largest}: x = {x[largest].item():+.6f}, code {codes[largest]:+d}, "
      f"code x scale = {codes[largest] * scale:+.6f}")
assert codes == pool[start:start + 32].view(torch.int8).tolist()
assert scale == struct.unpack("<f", bytes(row[32:]))[0] == (x.abs().max() / 127).item()
assert codes == torch.round(x / scale).to(torch.int8).tolist() and abs(codes[largest]) == 127
assert (torch.tensor(codes) * scale - x).abs().max() <= scale / 2

# %% [markdown]
# The scale is exactly `amax / 127` rounded to float32, the largest element became ±127, and every element is
# back within half a step (`scale / 2`) of its original. An `fp8_per_token_head` row has the same shape, but its
# codes are e4m3 floats: a sign bit, 4 exponent bits with bias 7 and 3 mantissa bits; exponent 0 means a denormal
# `m/8 * 2^-6`. The same key in that format, decoded by hand and by torch:

# %%
fp8_layout = layout_of("fp8_per_token_head")
fp8_pool = torch.zeros(fp8_layout.pool_bytes(1), dtype=torch.uint8)
kernels.write_kv(key, key.clone(), fp8_pool, torch.tensor([5]), fp8_layout)
fp8_row = fp8_pool[start:start + fp8_layout.row_bytes]


def e4m3_by_hand(b):
    s, e, m = b >> 7, (b >> 3) & 0xF, b & 0x7
    magnitude = m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -magnitude if s else magnitude


fp8_scale = fp8_row[32:].view(torch.float32).item()
by_hand = [e4m3_by_hand(b) for b in fp8_row[:32].tolist()]
by_torch = fp8_row[:32].view(torch.float8_e4m3fn).float().tolist()
smallest = min(range(32), key=lambda i: abs(x[i].item()))
for i in (largest, 1, smallest):
    b = fp8_row[i].item()
    print(f"element {i:2d}: x / scale = {x[i].item() / fp8_scale:+9.3f}, byte 0x{b:02x} = sign {b >> 7}, "
          f"exponent {(b >> 3) & 0xF:2d}, mantissa {b & 7} -> {by_hand[i]:+g}")
print(f"scale {fp8_scale!r} = amax / 448: {fp8_scale == (x.abs().max() / 448).item()}")
assert by_hand == by_torch and max(abs(c) for c in by_hand) == 448

# %% [markdown]
# ## 3. Per-token-head versus per-tensor scales, on real K/V
#
# A scale maps the values to the code range. The per-layer `fp8` format uses one scale for every token and head
# of a layer (minikv's engine uses 1, as vLLM does when a checkpoint carries no calibrated scales); a per-tensor
# int8 cache, which minikv does not offer but which is the obvious first idea, would need `amax / 127` of the
# whole tensor. The per-token-head formats give each row its own. How much does that matter on `tiny-gemma4`'s real
# keys and values?
#
# First, how much the rows differ. For each owning layer: the largest |value| in the whole tensor, and the
# median and smallest row amax. (Here and below, statistics of the model's K/V are printed to two significant
# digits: their last bits, and rarely a third digit, depend on the CPU's float arithmetic.)

# %%
print(f"{'layer':>5s} {'':2s} {'tensor amax':>11s} {'median row amax':>15s} {'smallest row amax':>17s}")
for layer, (k, v) in captured.items():
    for part, t in (("K", k), ("V", v)):
        row_amax = t.abs().amax(dim=-1)
        print(f"{layer:5d} {part:2s} {t.abs().max():11.1f} {row_amax.median():15.1f} {row_amax.min():17.1f}")

# %% [markdown]
# `tiny-gemma4`'s K and V are tame: no row's amax is more than a few times smaller than the tensor's. Each
# format's error on layer 0, K and V, with every format going through the real write kernel, except the
# per-tensor int8 marked `*`, which is not a minikv format and is computed with the same formula in torch. The
# per-layer `fp8` format appears twice: with the engine's default scale 1 and with a calibrated scale, the
# tensor's `amax / 448`.

# %%
def roundtrip(x, fmt, layer_scale=1.0):
    """x [tokens, kv_heads, head_size] written by the write kernel in `fmt`, then read back as float32."""
    lay = layout_of(fmt)
    pool = torch.zeros(lay.pool_bytes(-(-x.shape[0] // BLOCK_SIZE)), dtype=torch.uint8)
    kernels.write_kv(x, x, pool, torch.arange(x.shape[0]), lay, layer_scale, layer_scale)
    codes = lay.code_views(pool)[0].reshape(-1, *x.shape[1:])[: x.shape[0]].float()
    if lay.has_inline_scales:
        return codes * lay.scale_views(pool)[0].reshape(-1, x.shape[1])[: x.shape[0], :, None]
    return codes * layer_scale


def per_tensor_int8(x):
    scale = x.abs().max() / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


def errors_by_format(x):
    return {
        "fp8, scale 1": roundtrip(x, "fp8") - x,
        "fp8, calibrated": roundtrip(x, "fp8", x.abs().max().item() / 448) - x,
        "int8 per tensor*": per_tensor_int8(x) - x,
        "int8_per_token_head": roundtrip(x, "int8_per_token_head") - x,
        "fp8_per_token_head": roundtrip(x, "fp8_per_token_head") - x,
    }


errors = {"K": errors_by_format(k0), "V": errors_by_format(v0)}
print(f"{'format':20s} {'K mean |err|':>12s} {'K max':>8s} {'V mean |err|':>12s} {'V max':>8s}")
for name in errors["K"]:
    ek, ev = errors["K"][name].abs(), errors["V"][name].abs()
    print(f"{name:20s} {ek.mean():12.1e} {ek.max():8.1e} {ev.mean():12.1e} {ev.max():8.1e}")
mean_err = {part: {n: e.abs().mean().item() for n, e in errs.items()} for part, errs in errors.items()}
for part in ("K", "V"):
    assert min(mean_err[part], key=mean_err[part].get) == "int8_per_token_head"
    assert mean_err[part]["int8_per_token_head"] < mean_err[part]["int8 per tensor*"]
viz.quant_error_plot(errors["K"], title="Layer 0 K: quantization error by format")

# %%
viz.quant_error_plot(errors["V"], title="Layer 0 V: quantization error by format")

# %% [markdown]
# Two different stories. **int8** has evenly spaced levels, so its error is set by the step `scale`; a row's
# own scale gives the step `row amax / 127`, and a per-tensor scale gives every row the step of the largest one.
# Per-token-head int8 is the most accurate format here, its mean error a third to two fifths lower than
# per-tensor int8's, even on these tame tensors. **fp8** is a floating-point format: with 3 mantissa bits, the
# step next to a value is 1/8 of the power of two below it, a sixteenth to an eighth of the value, wherever it lies in
# its wide range. Its error therefore barely depends on the scale: scale 1, a calibrated per-tensor scale and a
# per-token-head scale land close together, all above int8's: near the top of a row's range, int8's 255 evenly
# spaced levels are much finer than fp8's (a step of `amax / 127` against fp8's step of 32 just below 448).
#
# Where per-token-head scales earn their keep is an **outlier**. Large models have a few tokens, often the first,
# whose K or V are tens of times larger than the rest. We make token 0 of layer 0's K 20 times larger and
# quantize again. A per-tensor scale now serves that one token; a per-token-head scale is unaffected for every
# other row.

# %%
outlier_k = k0.clone()
outlier_k[0] *= 20
with_outlier = errors_by_format(outlier_k)
others = slice(1, None)                   # every row but the outlier token
print(f"{'format':20s} {'mean |err| of the other tokens':>31s} {'before':>9s} {'ratio':>6s}")
for name, e in with_outlier.items():
    before = errors["K"][name][others].abs().mean()
    after = e[others].abs().mean()
    print(f"{name:20s} {after:31.1e} {before:9.1e} {f'x{after / before:.0f}':>6s}")
assert torch.equal(with_outlier["int8_per_token_head"][others], errors["K"]["int8_per_token_head"][others])
assert torch.equal(with_outlier["fp8_per_token_head"][others], errors["K"]["fp8_per_token_head"][others])
assert with_outlier["int8 per tensor*"][others].abs().mean() > \
    10 * errors["K"]["int8 per tensor*"][others].abs().mean()
viz.quant_error_plot({n: e[others] for n, e in with_outlier.items()},
                     title="Layer 0 K with one outlier token (x20): error of the other tokens")

# %% [markdown]
# Per-tensor int8's mean error on the other tokens grows more than tenfold: its step is now set by the
# outlier. The per-token-head formats give the other tokens *bit-identical* results, because each row is
# quantized on its own. fp8 with a per-tensor scale shrugs the outlier off too, thanks to its exponent, as long
# as the scaled values stay inside e4m3's range: scaled values below 2^-6 fall into e4m3's denormals and lose
# precision, and values above 448 are clamped (section 5 shows both edges). With scale 1, a key above 448 would
# be clamped, which is why a real per-tensor fp8 cache needs calibrated scales.

# %% [markdown]
# Does any of this change the model's answers? On 24 held-out prompts through the engine, every format gives
# the right continuation, with the same token ids as the float32 cache. `tiny-gemma4` is robust by construction:
# its K/V have no outliers, and its training recipe (recorded in `minikv/models/weights/tiny-gemma4/training.json`) ran
# three steps in four with K/V fake-quantized to one of the 8-bit formats. A large model without such training is
# where differences like those above turn into different tokens.

# %%
eval_prompts = task.prompts(24, seed=4)
answers = {}
for fmt in KV_CACHE_DTYPES:
    engine = minikv.LLM(model="tiny-gemma4", kv_cache_dtype=fmt, max_num_seqs=8, device=DEVICE, backend="torch")
    answers[fmt] = engine.generate(eval_prompts, params, use_tqdm=False)
    right = sum(task.check(p, o.text) for p, o in zip(eval_prompts, answers[fmt]))
    same = sum(o.token_ids == a.token_ids for o, a in zip(answers[fmt], answers["auto"]))
    layer_scales = {(a.impl.k_scale, a.impl.v_scale) for a in engine.attention_layers.values()}
    print(f"{fmt:22s} right {right}/24, token ids equal to auto's: {same}/24"
          + (f"; per-layer (K, V) scales used: {layer_scales}" if fmt == "fp8" else ""))
    assert right == 24 and same == 24 and layer_scales == {(1.0, 1.0)}

# %% [markdown]
# One more check that the captured K/V and the offline quantization above are what the engine itself stores: an
# `int8_per_token_head` engine's layer-0 pool holds, byte for byte, the write kernel's output for the captured
# float32 keys and values. (Layer 0's K/V depend only on the prompt tokens, not on the cache format.)

# %%
int8_engine = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=8,
                         device=DEVICE, backend="torch")
stored = {}
for p in prompts:
    int8_engine.add_request(p, params)
while int8_engine.has_unfinished():
    step = int8_engine.step()
    if step.is_prefill:
        name = "kv.model.layers.0.self_attn"
        pool, layout = int8_engine.arena.pool(name), int8_engine.arena.layout(name)
        (k_codes, v_codes), (k_scales, v_scales) = layout.code_views(pool), layout.scale_views(pool)
        b, o = prompt_slots(step) // BLOCK_SIZE, prompt_slots(step) % BLOCK_SIZE
        stored.update(k=k_codes[b, o].clone(), v=v_codes[b, o].clone(), ks=k_scales[b, o].clone(),
                      vs=v_scales[b, o].clone())
offline = torch.zeros(int8_layout.pool_bytes(-(-k0.shape[0] // BLOCK_SIZE)), dtype=torch.uint8)
kernels.write_kv(k0, v0, offline, torch.arange(k0.shape[0]), int8_layout)
(k_codes, v_codes), (k_scales, v_scales) = int8_layout.code_views(offline), int8_layout.scale_views(offline)
n, heads, size = k0.shape
same = [torch.equal(stored["k"], k_codes.reshape(-1, heads, size)[:n]),
        torch.equal(stored["v"], v_codes.reshape(-1, heads, size)[:n]),
        torch.equal(stored["ks"], k_scales.reshape(-1, heads)[:n]),
        torch.equal(stored["vs"], v_scales.reshape(-1, heads)[:n])]
print("engine pool == write kernel on the captured K/V (K codes, V codes, K scales, V scales):", same)
assert all(same)

# %% [markdown]
# Those stored scales, for the first 64 prompt tokens: every (token, head) has its own, for K and for V. They vary
# less than in most models, by about a factor of two across tokens, because Gemma-4 RMS-normalizes every key and
# value head before attention (the key norm has a learned gain, the value norm none), which keeps the rows'
# ranges alike. (`viz.scale_heatmap` draws two sets of scales side by side on one colour scale.)

# %%
print(f"K scales {stored['ks'].min():.3f} to {stored['ks'].max():.3f}, "
      f"V scales {stored['vs'].min():.3f} to {stored['vs'].max():.3f}")
assert stored["ks"].max() > 1.5 * stored["ks"].min() and stored["vs"].max() > 1.5 * stored["vs"].min()
viz.scale_heatmap(stored["ks"][:64], stored["vs"][:64], labels=("K scales", "V scales"),
                  title="Layer 0 int8 per-token-head scales, first 64 tokens")

# %% [markdown]
# ## 4. The write kernel, program by program
#
# `kernels.write_kv(key, value, pool, slot_mapping, layout)` stores the new tokens of a step. Here is the kernel:

# %%
print(inspect.getsource(cache_write._write_kv_kernel.fn))   # .fn: the Python function under @triton.jit

# %% [markdown]
# and the helper it calls once for K and once for V:

# %%
print(inspect.getsource(cache_write._store_half.fn))

# %% [markdown]
# The launch grid is one-dimensional: program `p` takes tokens `p * BLOCK_T` to `p * BLOCK_T + BLOCK_T - 1`, with
# all KV heads (`BLOCK_H`) and the whole head (`HEAD_SIZE`) in one tile. Each program:
#
# 0. waits until the kernel before it on the GPU has finished (`launch.wait_for_inputs()`): on Hopper GPUs the next
#    kernel may start early, while this one ends (programmatic dependent launch). Here, in the interpreter, the call
#    does nothing;
# 1. loads its tokens' slots; a slot of -1 (or a lane past the last token) is masked out, and its `safe` slot 0
#    is only there so the address arithmetic stays in bounds;
# 2. turns each slot into a row offset, `block * block_stride + offset * slot_stride + head * row_stride`, in
#    units of the code type (one byte for the 8-bit formats): the same arithmetic as `KVLayout.row_offset`;
# 3. for K, then for V at `kv_stride` further on, loads the `[BLOCK_T, BLOCK_H, HEAD_SIZE]` tile and, depending on
#    the format known at compile time (`FMT`), stores it as is, quantizes it with the layer scale, or takes each
#    row's amax, computes the row's scale, quantizes and stores the codes;
# 4. for the per-token-head formats, stores each row's scale at `(row + scale_offset) // 4` of an fp32 view of
#    the same pool: row offsets are in bytes for the 8-bit formats, and `KVLayout` keeps every row a multiple of
#    4 bytes long, so that division is exact.
#
# No program reads what another writes, so the programs can run in any order, in parallel on a GPU. On a GPU the
# tiles are small and there are many programs. The interpreter runs each program as Python over NumPy arrays, one
# after another, so there `minikv.kernels.launch` makes the tile as large as the problem and launches as few
# programs as it can:

# %%
for num_tokens in (5, 300):
    cfg_cpu = launch.write_config(num_tokens, config.num_kv_heads, config.head_size)
    print(f"{num_tokens:3d} tokens: BLOCK_T={cfg_cpu.block_t}, BLOCK_H={cfg_cpu.block_h} -> "
          f"{-(-num_tokens // cfg_cpu.block_t)} program(s) in the interpreter")

# %% [markdown]
# To watch the programs one at a time, we call the kernel ourselves with `BLOCK_T = 2` on five tokens whose slots
# are scattered over a two-block pool, one of them -1. With that tile the full grid is three programs. A grid
# always starts at program 0, so launching a grid of 1, then 2, then 3 programs on a fresh pool shows what each
# added program writes.

# %%
gen = torch.Generator().manual_seed(0)
step_keys = torch.randn(5, config.num_kv_heads, config.head_size, generator=gen)
step_values = torch.randn(5, config.num_kv_heads, config.head_size, generator=gen)
step_slots = torch.tensor([17, 3, -1, 30, 4])


def launch_write(layout, num_programs, block_t=2):
    """Run the first `num_programs` programs of write_kv's kernel with BLOCK_T=block_t on a fresh pool."""
    pool = torch.zeros(layout.pool_bytes(2), dtype=torch.uint8)
    heads = launch.write_config(5, layout.num_kv_heads, layout.head_size).block_h        # all KV heads per program
    kernels.write_kv(step_keys, step_values, pool, step_slots, layout,
                     config=launch.WriteConfig(block_t=block_t, block_h=heads), num_programs=num_programs)
    return pool


def written_slots(layout, pool):
    """Slots whose K rows hold any non-zero byte."""
    slot_bytes = pool.view(2, 2, BLOCK_SIZE, layout.slot_bytes)[:, 0]     # [block, slot, bytes] of the K halves
    return [b * BLOCK_SIZE + o for b in range(2) for o in range(BLOCK_SIZE) if slot_bytes[b, o].any()]


print("tokens 0..4 go to slots", step_slots.tolist())
seen = []
for programs in (1, 2, 3):
    now = written_slots(int8_layout, launch_write(int8_layout, programs))
    lanes = [t if t < 5 else f"{t} (past the end)" for t in (2 * programs - 2, 2 * programs - 1)]
    print(f"grid of {programs}: program {programs - 1} handles tokens {lanes[0]} and {lanes[1]}; "
          f"it added slot(s) {sorted(set(now) - set(seen))}")
    seen = now
assert seen == sorted([3, 4, 17, 30])

# %% [markdown]
# Program 0 wrote tokens 0 and 1 (slots 17 and 3); program 1 wrote only token 3 (slot 30), since token 2's slot
# is -1; program 2 wrote token 4 (slot 4), its second lane being past the last token. Slot 0, where the masked
# lanes' `safe` address points, stayed untouched.
#
# Tiling must not change the bytes. For every format, the three-program launch, `write_kv` with its own
# one-program tile, and the pure-PyTorch `write_kv_reference` leave byte-identical pools. For `auto` the model
# dtype is float32 here, so the row is 128 bytes of float32.

# %%
for fmt in KV_CACHE_DTYPES:
    lay = layout_of(fmt)
    tiled = launch_write(lay, 3)
    by_kernel = torch.zeros(lay.pool_bytes(2), dtype=torch.uint8)
    by_reference = torch.zeros(lay.pool_bytes(2), dtype=torch.uint8)
    kernels.write_kv(step_keys, step_values, by_kernel, step_slots, lay)
    kernels.write_kv_reference(step_keys, step_values, by_reference, step_slots, lay)
    print(f"{fmt:22s} pool {lay.pool_bytes(2):5d} bytes, slots written {written_slots(lay, by_kernel)}; "
          f"write_kv == reference: {torch.equal(by_kernel, by_reference)}, "
          f"3 programs of 2 == reference: {torch.equal(tiled, by_reference)}")
    assert torch.equal(by_kernel, by_reference) and torch.equal(tiled, by_reference)

# %% [markdown]
# ## 5. fp8 rounding, bit-exact against torch
#
# The fp8 formats must produce exactly the codes torch's own cast `x.to(torch.float8_e4m3fn)` produces, so that a
# cache written by the kernel and one written by the reference are the same bytes. Our test values: every finite
# float16 value, converted to float32. float16 covers e4m3's whole range with much finer steps, so every rounding
# case of e4m3 appears among them.
#
# Why not just cast inside the kernel? Here is Triton's own cast, `x.to(tl.float8e4nv)`, in a three-line kernel,
# on the values within e4m3's range (±448):

# %%
all_halves = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16)
finite = all_halves[torch.isfinite(all_halves)].to(torch.float32)


@triton.jit
def triton_cast_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Triton's own float32 -> e4m3 cast, as bytes. For comparison only: minikv does not use it."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(out_ptr + offsets, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=offsets < n)


in_range = finite[finite.abs() <= 448]
cast_codes = torch.empty(in_range.shape, dtype=torch.uint8)
triton_cast_kernel[(1,)](in_range, cast_codes, in_range.numel(), BLOCK=triton.next_power_of_2(in_range.numel()))
wrong = (cast_codes != quant.encode_e4m3_reference(in_range)).nonzero().flatten()
print(f"Triton's cast in the interpreter disagrees with torch on {wrong.numel()} of {in_range.numel()} values, "
      "for example:")
for i in wrong[:: max(1, wrong.numel() // 4)][:4].tolist():
    print(f"  {in_range[i].item():+.9g}: Triton 0x{cast_codes[i].item():02x}, "
          f"torch 0x{quant.encode_e4m3_reference(in_range[i:i + 1]).item():02x}")
assert wrong.numel() > 0

# %% [markdown]
# On a GPU, compiled casts have a different problem: `minikv.kernels.quant` notes that they saturate past 448
# differently from torch. So `minikv.kernels.quant.e4m3_bits` builds the code from the float's bits: it rebiases
# the exponent (127 to 7), rounds the 23-bit mantissa to 3 bits with ties to even, and handles the denormal range
# by letting a float addition do the rounding. `quant.encode_e4m3` runs that encoder as a Triton kernel on a
# float32 tensor, and `encode_e4m3_reference` is torch's cast. Compared on all finite float16 values:

# %%
ours, theirs = quant.encode_e4m3(finite), quant.encode_e4m3_reference(finite)
mismatches = int((ours != theirs).sum())
print(f"{finite.numel()} finite float16 values; distinct e4m3 codes produced: {theirs.unique().numel()}; "
      f"mismatches: {mismatches}")
assert finite.numel() == 65536 - 2048 and mismatches == 0

# %% [markdown]
# Zero mismatches over 63,488 values, which between them produce all 254 e4m3 codes that are not NaN. The
# interesting cases, each shown with its float32 input, torch's code and
# ours, and the value the code stands for. Between 1 and 2 e4m3 has steps of 1/8, so 1.0625 is exactly halfway
# between 1.0 and 1.125 and rounds to the code with an even mantissa; the smallest denormal is 2^-9; and the
# largest finite e4m3 value is 448, with the next step (480) taken by NaN in the `fn` ("finite") variant.

# %%
cases = [
    ("tie between 1.0 and 1.125 -> even (1.0)", 1.0625),
    ("tie between 1.125 and 1.25 -> even (1.25)", 1.1875),
    ("tie between 16 and 18 -> even (16)", 17.0),
    ("just above that tie -> 18", 17.0 + 2**-6),
    ("smallest denormal 2^-9", 2.0**-9),
    ("half of it, a tie -> 0", 2.0**-10),
    ("1.5 x 2^-9, a tie -> 2^-8 (even)", 3 * 2.0**-10),
    ("largest denormal 7 x 2^-9", 7 * 2.0**-9),
    ("between it and 2^-6, a tie -> 2^-6", 15 * 2.0**-10),
    ("smallest normal 2^-6", 2.0**-6),
    ("largest finite, 448", 448.0),
    ("tie between 448 and 480 -> 448", 464.0),
    ("above the tie: past 448", 465.0),
    ("far past: 1000", 1000.0),
    ("negative zero", -0.0),
    ("-300 (sign bit set)", -300.0),
]
values = torch.tensor([v for _, v in cases], dtype=torch.float32)
ours, theirs = quant.encode_e4m3(values), quant.encode_e4m3_reference(values)
print(f"{'case':40s} {'float32':>14s} {'torch':>6s} {'ours':>6s} {'e4m3 value':>11s}")
for (label, _), value, t, o in zip(cases, values.tolist(), theirs.tolist(), ours.tolist()):
    decoded = torch.tensor([t], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()
    print(f"{label:40s} {value:14.9g} {f'0x{t:02x}':>6s} {f'0x{o:02x}':>6s} {decoded:11.6g}")
assert torch.equal(ours, theirs)
print("this torch saturates finite overflow to 448 (0x7e) rather than NaN:", quant.torch_e4m3_saturates("cpu"))

# %% [markdown]
# Every row agrees. Rows "above the tie" and "far past" depend on torch: values that round past 448 become 448
# (`0x7e`) on this torch, while older torch versions give NaN (`0x7f`) there (per `minikv.kernels.quant`, the
# change came with torch 2.12); `torch_e4m3_saturates` probes the torch in use and the encoder follows it. The
# cache never meets that case, because the quantizers clamp to ±448 *before* encoding: with the per-layer `fp8`
# format and scale 1, a key of 1000 is stored as 448, on every torch.

# %%
big = torch.full((1, config.num_kv_heads, config.head_size), 1000.0)
fp8_layer_layout = layout_of("fp8")
clamped = torch.zeros(fp8_layer_layout.pool_bytes(1), dtype=torch.uint8)
kernels.write_kv(big, big.clone(), clamped, torch.tensor([0]), fp8_layer_layout)
stored_codes = fp8_layer_layout.code_views(clamped)[0][0, 0].flatten()   # K of slot 0, both heads
print("stored codes:", sorted(set(stored_codes.view(torch.uint8).tolist())), "->",
      sorted(set(stored_codes.float().tolist())))
assert bool((stored_codes.float() == 448).all())

# %% [markdown]
# ## Summary
#
# * An 8-bit cache halves a 16-bit one. The per-token-head formats add a 4-byte fp32 scale to every row of
#   `head_size` codes: an eighth more at head size 32, a thirty-second more at 128.
# * A row is `[codes | scale]`; reading the bytes back by hand gives the int8 codes (two's complement), the fp32
#   scale `amax / 127`, and the e4m3 codes (sign, 4-bit exponent, 3-bit mantissa) exactly as torch reads them.
# * On `tiny-gemma4`'s real K/V, per-token-head int8 is the most accurate format, and with one outlier token
#   per-tensor int8's error on every other token grows more than tenfold, while the per-token-head formats do not
#   change at all. fp8 trades precision for range: its error hardly depends on the scale. All four formats
#   answer 24/24 prompts with the float32 cache's token ids.
# * The write kernel's programs each quantize and store a tile of tokens, independently; any tiling gives the
#   same bytes as the pure-PyTorch reference, for every format.
# * The fp8 encoder matches torch's cast bit for bit on all 63,488 finite float16 values, ties, denormals and
#   overflow included.
#
# The inline scales have one more property that matters: a new pool is all zeros, so every scale must be set to
# 1.0 once before anything reads it. *When* that happens is the subject of notebook 03.

# %% [markdown]
# ## Try it yourself
#
# Three exercises, in the style of Sebastian Raschka's *LLMs from scratch*. Each has three cells: put your answer
# into the first (replace `None`) and run it; the second runs the code, computes the true answer and says whether
# yours is right, without printing it; the third is the worked solution, folded (in JupyterLab, click the bar left
# of it; on the docs site, click "Solution"). The notebook tests run all three, with no answer filled in.
#
# **Exercise 1: an outlier in V.** Section 3 made one *key* token 20 times larger. Do the same to token 0 of layer
# 0's *values*. For which of the five formats of section 3 does the error on the *other* tokens change at all?

# %% tags=["exercise"]
my_answer_1 = None          # your answer: a set of format names as section 3 prints them, e.g. {"..."}

# %% tags=["check"]
from minikv.viz.exercises import check

outlier_v = v0.clone()
outlier_v[0] *= 20
v_with_outlier = errors_by_format(outlier_v)
changed_formats = {name for name, e in v_with_outlier.items() if not torch.equal(e[others], errors["V"][name][others])}
check("Exercise 1", my_answer_1, changed_formats)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: the two formats whose scale is computed from the whole tensor. The per-token-head formats quantize
# every row on its own, so the other rows' bytes do not change at all; fp8 with the engine's fixed scale 1 has no
# scale to change either. Per-tensor int8's step is set by the outlier, so its error on the other tokens grows
# more than tenfold; the calibrated fp8 scale (amax / 448) grows 20 times too, but fp8's exponent absorbs most of
# it.
growth = {name: (e[others].abs().mean() / errors["V"][name][others].abs().mean()).item()
          for name, e in v_with_outlier.items()}
assert changed_formats == {"int8 per tensor*", "fp8, calibrated"}
assert growth["int8 per tensor*"] > 10 and growth["fp8, calibrated"] < 2
print("answer:", sorted(changed_formats))

# %% [markdown]
# **Exercise 2: a head of 64.** The inline scale costs 4 bytes per row. With head size 64 instead of 32 (and the
# same 2 KV heads and 4 owning layers), what share of an `auto` bfloat16 cache does `int8_per_token_head` need?

# %% tags=["exercise"]
my_answer_2 = None          # your answer: a fraction between 0 and 1

# %% tags=["check"]
wide = {fmt: layout_of(fmt, torch.bfloat16, config.num_kv_heads, 64).bytes_per_token() * len(owners)
        for fmt in ("auto", "int8_per_token_head")}
check("Exercise 2", my_answer_2, wide["int8_per_token_head"] / wide["auto"], rel=0.01)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: (64 + 4) / (2 x 64): half of the 16-bit cache, plus 4 bytes of scale per 128 bytes of K or V. The
# larger the head, the closer the share comes to one half (section 1's table: 56.2% at 32, 51.6% at 128).
assert wide["int8_per_token_head"] * 128 == wide["auto"] * 68
print("answer:", 68 / 128)

# %% [markdown]
# **Exercise 3: a key too large for `fp8` with scale 1.** Multiply token 0 of layer 0's keys by 1000. At the
# engine's scale of 1 the per-layer `fp8` format clamps it (section 5). What is the smallest per-layer scale at
# which none of that token's elements is clamped? (Within 1% counts.)

# %% tags=["exercise"]
my_answer_3 = None          # your answer: a scale (a number)

# %% tags=["check"]
huge = k0.clone()
huge[0] *= 1000
least_scale = huge[0].abs().max().item() / 448
check("Exercise 3", my_answer_3, least_scale, rel=0.01)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: the token's amax / 448 (e4m3's largest finite value). At that scale its largest element comes back
# whole, but one scale serves the whole layer: every other token's keys shrink to codes near zero and lose their
# precision. The per-token-head format gives each row its own amax / 448 instead.
at_scale_1 = roundtrip(huge, "fp8")[0].abs().max().item()
at_least = roundtrip(huge, "fp8", layer_scale=least_scale * 1.001)[0].abs().max().item()
assert at_scale_1 == 448.0 and huge[0].abs().max() > 448
assert abs(at_least / huge[0].abs().max().item() - 1) < 0.07     # e4m3 keeps 3 mantissa bits
print("answer:", f"{least_scale:.3g}", "(the token's amax / 448)")
