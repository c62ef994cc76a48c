# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Catching defects like these
#
# Notebooks 03 and 04 reproduce two KV-cache defects when they are told which one to bring back. Neither defect
# was subtle once found. Why no test caught them before is partly on record and partly minikv's reading:
#
# - TensorRT-LLM's attention backend matrix skipped every FP8 cross-attention case behind a "no fp8 cross"
#   filter. Pull request [#20958](https://github.com/NVIDIA/TensorRT-LLM/pull/20958) removed the filter, and 14
#   of the cases it let in then failed on the fused context path; its reviewers also asked for a cross pool that
#   holds the requests' blocks but fewer than twice that, and for the same request submitted twice.
# - vLLM's scale wipe damaged the whole first batch an engine served, and only that batch. The evidence of the
#   pull requests that propose a fix ([#51061](https://github.com/vllm-project/vllm/pull/51061), closed, and
#   [#51091](https://github.com/vllm-project/vllm/pull/51091), open as of 2026-12-02) compares a request's KV
#   bytes in the first batch with the same request's in a later batch. That no test in the tree made that
#   comparison is minikv's guess; upstream does not say. (Issues
#   [#50702](https://github.com/vllm-project/vllm/issues/50702) and
#   [#50749](https://github.com/vllm-project/vllm/issues/50749), which the first pull request linked to this
#   defect, report failures its successor calls distinct from the wipe, which it still calls real.)
#
# This notebook runs **the hunter**, `minikv.hunt`: a differential tester that searches engine configurations
# with [hypothesis](https://hypothesis.readthedocs.io) and checks invariants a maintainer can write without
# knowing either defect. It is told nothing but the `reintroduce=` tuple, which it passes to every
# `minikv.LLM(...)` unread. We run it on the fixed engine, then on each defect; put what it prints next to
# upstream's reports; look at the checks upstream's matrices lacked (as minikv reads them) and what each costs;
# let it find a defect planted here, which it was not written for; and point its oracles at another engine's
# outputs. The guide is [docs/hunt.md](../docs/hunt.md); `minikv hunt` is the same search on the command line.
#
# Every hunt here is bounded by a number of scenarios, not seconds, so it runs the same scenarios in the same
# order on every machine, and prints no timing. Measured times come from `results/hunt.json`.

# %%
# %matplotlib inline
import dataclasses
import json
import os
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")       # no progress bars in recorded outputs

import torch

import minikv
from minikv.hunt import KVRow, MinikvEngine, Request, RequestResult, Run, Scenario, hunt, oracles
from minikv.hunt.figure import search_map
from minikv.hunt.reference import DenseReference
from minikv.hunt.scenario import blocks_for
from minikv.hunt.seams import pool_of, wrap_kernel_op
from minikv.hunt.strategies import cells, prompt_pool

torch.manual_seed(0)
torch.set_num_threads(1)            # tiny tensors: one thread is faster (hunt() uses one as well)
REFERENCE = DenseReference()        # the dense references, cached across every hunt below
# measured by `minikv hunt --every-defect` (section 7); found beside notebooks/, here, or in minikv's checkout
RESULTS = json.loads(next(p for p in (Path("../results/hunt.json"), Path("results/hunt.json"),
                                      Path(minikv.__file__).resolve().parents[1] / "results" / "hunt.json")
                          if p.exists()).read_text())

for name, o in oracles.ORACLES.items():
    print(f"{name:26} {'(needs the reference) ' if o.needs_reference else ''}{o.statement}")

# %% [markdown]
# ## 1. Invariants, not defects
#
# The six invariants above are what the hunter checks after every scenario. None mentions KV sharing, scales,
# strides or context paths; each is something any paged-KV engine owes its users:
#
# - **runs**: a configuration the engine accepts does not raise.
# - **writes-in-bounds**: the hunter copies the engine's whole KV arena (its pools and the guard zones between
#   them) before each step and diffs it after. Every changed byte must lie in a row the step's slot mapping
#   names: the codes and inline scales, K and V, of the slots the step was supposed to write.
# - **kernels-match-references**: with the Triton backend, every kernel call is repeated through its
#   pure-PyTorch reference on the same inputs (the default backend here *is* the references, so it is silent).
# - **repeat-identical**: the same batch submitted again after the first one finished, and scheduled the same
#   way, gives the same tokens, and right after prefill the same KV bytes, position by position.
# - **schedule-invariant**: copies of one request give the same tokens whatever the batch geometry, pool size,
#   prefix caching, preemption or arrival time.
# - **matches-reference**: greedy tokens equal the model run densely, without the engine, with every K and V
#   quantized and dequantized as the cache format stores them. A quantized cache is held to its own
#   quantization error, computed another way (in float64); a divergence is excused only at a near tie, where the
#   reference's logits for the two tokens are within twice the row's tolerance of each other. Where the tokens
#   agree, each row of logits must lie within its tolerance: 2 x (compute + max(own, spread) + flip), worked out
#   from the scenario (docs/hunt.md, "How close is close enough": the dtype's rounding, the dense model's own run
#   in that dtype, runs that round at random, and the summed moves of the K/V codes its rounding could flip,
#   flipped one layer at a time).

# %%
print(f"over the fixed engine's hunt no row of logits used more than "
      f"{RESULTS['quantities']['tolerance_used']['display']} (results/hunt.json)")

# %% [markdown]
# ## 2. The search
#
# Three choices pick different code paths through an engine: the model (another architecture, other attention
# layers), the KV cache format (another layout, other element bytes) and the activation dtype (a float32 model
# takes other context paths). The hunter stratifies on them: each **cell** of that matrix gets its own
# hypothesis search, and the cells take turns in rounds of 1, 2, 4, ... examples each. The first example of
# every cell is its plainest configuration, so the first round is the whole matrix at its defaults: nothing is
# filtered out. Inside a cell, hypothesis draws everything else: `max_num_seqs`, block size, scale placement,
# pool sizes down to the smallest the requests can run in, prefix caching, one to four requests (prompts from the
# model's held-out set, lengths, arrival steps, repeats), a second submission of the same batch, and a
# `sleep()`/`wake_up()` between the two. When an invariant fails, hypothesis shrinks the scenario to a minimal
# one, and the hunter prints it as a ready-to-run `minikv.LLM(...)` call.

# %%
for i, cell in enumerate(cells()):
    print(f"cell {i + 1:2}: {' x '.join(cell)}")

# %% [markdown]
# ## 3. The fixed engine comes out clean
#
# 24 scenarios: the first round (every cell at its plainest configuration), then the second round's first eight
# (`minikv hunt` runs as many as its time budget allows; section 7 has how many fit in 120 s). The engine adapter, `MinikvEngine`, is what
# `hunt()` drives; `remember=True` keeps its runs, so the later hunts over the same engine pay once per scenario.

# %%
ENGINE = MinikvEngine(remember=True)              # the fixed engine: reintroduce=()
clean = hunt(engine=ENGINE, max_scenarios=24, budget_s=None, reference=REFERENCE, progress=False)
print(clean.text(portable=True))
print(f"{clean.scenarios_run} scenarios, {clean.refused} refused by the engine, cells covered: "
      f"{len({(s.model, s.kv_cache_dtype, s.dtype) for s in clean.tried})} of {len(cells())}")
assert not clean.found and clean.refused == 0

# %% [markdown]
# ## 4. Each defect, reintroduced, found blind
#
# The same search, on engines that differ only in their `reintroduce=` tuple. The engine refuses a defect where its mechanism
# cannot occur (`scale-wipe` on a model without KV sharing, the cross defects on a decoder-only model or with a
# 16-bit cache); the hunter takes a refused configuration as outside the engine's domain and moves on, without
# asking why.

# %%
engines, found = {}, {}
for name in minikv.bugs.DEFECTS:
    engines[name] = MinikvEngine(reintroduce=(name,), remember=True)
    found[name] = hunt(engine=engines[name], max_scenarios=48, budget_s=None, reference=REFERENCE, progress=False)
    print(f"===== reintroduce=({name!r},)")
    print(found[name].text(portable=True))
    print()
assert all(r.found for r in found.values())

# %% [markdown]
# The map below shows what each hunt ran, in order: rows are cells, columns scenarios. On the fixed engine the
# first round walks down the matrix. With a defect, the search follows exactly the same path (section 5), through
# the cells the engine refuses for that defect (hollow), until the first scenario that breaks an invariant (the red
# cross); hypothesis then spends a few runs shrinking it.

# %%
search_map({"fixed engine": clean, **{f"reintroduce=({n!r},)": r for n, r in found.items()}})

# %% [markdown]
# ## 5. Blind, in code and in behaviour
#
# The hunter's modules never name a defect, never import the registry, and only store, pass on or print the
# tuple (`tests/test_hunt.py` checks both in their syntax trees). In behaviour: up to its finding, each hunt ran
# exactly the scenarios the fixed engine's hunt ran, in the same order.

# %%
for name, report in found.items():
    before = report.finding.scenarios_before
    print(f"{name:24} first failure at scenario {before + 1:2}; the {before} before it are the fixed engine's "
          f"first {before}: {report.tried[:before] == clean.tried[:before]}")

# %% [markdown]
# ## 6. Next to upstream's reports
#
# | defect | upstream reported | the hunter printed (above) |
# |---|---|---|
# | scale wipe (vLLM) | int8/fp8 per-token-head caches only; the first scheduled batch after start, exactly `max_num_seqs` requests, wrong in every run; later batches clean; 16-bit caches clean | a `tiny-gemma4` per-token-head cell; one request in the first batch leaves the dense reference |
# | cross stride (TensorRT-LLM #19861) | FP8 cross pool addressed at 16-bit stride; fine with twice the blocks, an illegal memory access or silently wrong tokens below that | `tiny-t5` x `fp8`: the first step writes bytes of the first cross pool outside the rows its slot mapping names, at the engine's default pool size |
# | FP8 context read (TensorRT-LLM #20958) | the fused context kernel read the FP8 cross pool as 16-bit; 14 backend-matrix cases off from the golden by about 1e5 | `tiny-t5` x `fp8` x `float16`: the first token already leaves the reference |
#
# Each shrunk reproduction is a plain minikv program that checks the invariant itself: it prints what was expected
# beside what was seen, and exits 1 when they differ. Run the one for the FP8 context read as printed, then with
# the defect switched off:

# %%
import contextlib
import io


def run_as_printed(code):
    """(exit status, what it printed) of a reproduction run as printed."""
    out, status = io.StringIO(), 0
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, "<reproduction>", "exec"), {})
        except SystemExit as done:
            status = done.code
    return status, out.getvalue().strip()


b2 = found["cross-fp8-context-read"].finding
for label, code in (("with the defect", b2.snippet),
                    ("without it", b2.snippet.replace("reintroduce=('cross-fp8-context-read',)", "reintroduce=()"))):
    status, out = run_as_printed(code)
    print(f"{label}: exit status {status}; the expected and seen tokens "
          f"{'differ' if status else 'agree'}")

# %% [markdown]
# ## 7. What upstream's test matrices lacked, and what each check costs
#
# For TensorRT-LLM the missing cases are on record (the filter the fix removed, the cases its reviewers asked
# for); for vLLM the missing check is minikv's reading.
#
# **The first batch against a later one (vLLM).** The comparison the fix's evidence reports: submit a batch, let
# it finish, submit it again, compare tokens and KV bytes. Alone, it finds the scale wipe, and says where: the
# scales, not the codes, of the shared pool differ between the two batches.

# %%
only_repeat = hunt(engine=engines["scale-wipe"], oracles=("repeat-identical",), max_scenarios=48, budget_s=None,
                   reference=REFERENCE, progress=False)
print(only_repeat.text(portable=True).split("reproduction:")[0])

# %% [markdown]
# **The "no fp8 cross" filter (TensorRT-LLM).** Take the cells where cross attention reads a quantized cache out
# of the matrix, as the filter did. What is left cannot reach either cross defect: every remaining cell is
# decoder-only or has a 16-bit cache, and the engine refuses the defects there.

# %%
def quantized_cross(cell):
    model, fmt, _ = cell
    return minikv.models.registry.model_config(model).is_encoder_decoder and fmt != "auto"


filtered = [c for c in cells() if not quantized_cross(c)]
print(f"cells after the filter: {len(filtered)} of {len(cells())}; with quantized cross attention: "
      f"{sum(map(quantized_cross, filtered))}")
try:
    hunt(engine=engines["cross-fp8-context-read"], cells=filtered, max_scenarios=16, budget_s=None,
         reference=REFERENCE, progress=False)
except ValueError as err:
    print("filtered matrix:", str(err).split(";")[0])
print(f"unfiltered: found at scenario {found['cross-fp8-context-read'].finding.scenarios_before + 1} "
      f"(cell {' x '.join(found['cross-fp8-context-read'].finding.cell)})")

# %% [markdown]
# **A pool that holds the blocks but fewer than twice (the reviewers' request).** A golden comparison sees the
# cross stride only when the pool is smaller than twice the need, because below that the doubled addresses
# overrun into live data; the byte diff sees it at every size. Four requests on `tiny-t5`, FP8, with the
# historical stride:

# %%
four = tuple(Request(p, 2) for p in prompt_pool("tiny-t5")[:4])
base = Scenario("tiny-t5", "fp8", "float16", requests=four, max_num_seqs=4, block_size=8)
need = sum(blocks_for(len(r.prompt), 8) for r in four)
b1_engine = MinikvEngine(reintroduce=("cross-stride",))
for label, blocks in (("the need", need), ("1.5 x the need", need * 3 // 2), ("2 x the need", 2 * need),
                      ("the engine's default", None)):
    run = b1_engine.run(dataclasses.replace(base, cross_pool_blocks=blocks))
    refs = {r.prompt: REFERENCE.get("tiny-t5", "fp8", "float16", r.prompt) for r in four}
    outcome = {o: "fails" if oracles.ORACLES[o].check(run, refs) else "holds"
               for o in ("matches-reference", "writes-in-bounds")}
    print(f"cross pool = {label:22} ({'auto' if blocks is None else blocks:>4} blocks): "
          f"matches-reference {outcome['matches-reference']}, writes-in-bounds {outcome['writes-in-bounds']}")

# %% [markdown]
# **What they cost.** Measured with `minikv hunt --every-defect` on the 2-core CPU this project is built on,
# shared with other work at the time (the load is recorded), torch backend. Each check upstream lacked costs one
# more engine run of a batch (the second submission), a byte copy and compare of the cache per step, or the matrix
# cells the filter removed; the hunter spends seconds, not a GPU.

# %%
def table(t):
    widths = [max(len(str(x)) for x in col) for col in zip(t["columns"], *t["rows"])]
    lines = [" | ".join(str(x).ljust(w) for x, w in zip(row, widths)) for row in [t["columns"], *t["rows"]]]
    return "\n".join([t["caption"], lines[0], "-+-".join("-" * w for w in widths), *lines[1:]])


q = RESULTS["quantities"]
print(f"fixed engine: {q['fixed_scenarios']['display']} clean within {q['budget']['display']}; "
      f"{q['load_average']['display']}")
for name in minikv.bugs.DEFECTS:
    print(f"minikv hunt --reintroduce {name}: {q[name.replace('-', '_') + '_wall']['display']}")
print()
print(table(RESULTS["tables"]["defects"]))
print()
print(table(RESULTS["tables"]["upstream_checks"]))

# %% [markdown]
# ## 8. A defect it was not written for
#
# Plant a new one: a cache writer that stores the codes but never the scales of the engine's last KV pool. It is
# planted by wrapping the engine's kernel ops (`llm.kernel_ops`, through `minikv.hunt.seams`), and handed to the
# hunter as an `instrument` applied to every engine it builds. The hunter's code is unchanged.

# %%
def skip_scale_write_in_last_pool(llm):
    last = list(llm.arena.offsets)[-1]

    def make(write_kv):
        def planted(key, value, pool, slot_mapping, spec, *args, **kwargs):
            name, layout = pool_of(llm, pool)
            if name != last or not layout.has_inline_scales:
                return write_kv(key, value, pool, slot_mapping, spec, *args, **kwargs)
            kept = [s.clone() for s in layout.scale_views(pool)]
            write_kv(key, value, pool, slot_mapping, spec, *args, **kwargs)
            for scales, old in zip(layout.scale_views(pool), kept):
                scales.copy_(old)
        return planted
    wrap_kernel_op(llm, "write_kv", make)


planted = hunt(instrument=skip_scale_write_in_last_pool, max_scenarios=48, budget_s=None, reference=REFERENCE,
               progress=False)
print(planted.text(portable=True))
assert planted.found

# %% [markdown]
# ## 9. Pointing it at another engine
#
# The oracles read records, not engines (`minikv.hunt.record`): per request its token ids, how it was scheduled,
# and its KV bytes right after prefill, position by position (codes and scales apart); per step the bytes changed
# outside its slot mapping. An adapter for another engine fills them from that engine's outputs: token ids from
# its request outputs, KV bytes by reading its cache tensors through its block tables, and a scenario runner that
# maps each knob (`max_num_seqs`, block size, pool sizes, prefix caching) to its configuration. Here, two batches
# of "another engine", written out by hand: the same request in the first and in a later batch, same tokens,
# one scale different.

# %%
same_schedule = (("prefill", ((0, 0),)), ("decode", ((0, 0),)))
first = RequestResult(index=0, wave=0, prompt="3 7 11 15", max_tokens=2, token_ids=(3, 9), finish_reason="length",
                      schedule=same_schedule, kv={"layer.2": (KVRow(codes=b"\x10\x7f", scales=b"\x00\x00\x80\x3f"),)})
later = dataclasses.replace(first, wave=1, kv={"layer.2": (KVRow(codes=b"\x10\x7f", scales=b"\x0a\xd7\xa3\x3b"),)})
other = Run(Scenario("their-model", "int8_per_token_head"), requests=[first, later])
for v in oracles.check(other, refs={}, names=["repeat-identical", "schedule-invariant"]):
    print(f"{v.oracle}: {v.summary}")

# %% [markdown]
# Which invariants transfer: **runs**, **repeat-identical** and **schedule-invariant** need nothing but the
# engine's own outputs; **writes-in-bounds** needs a snapshot of the cache memory before and after a step and the
# step's slot mapping (an engine without guard zones still shows writes into other requests' blocks and other
# layers' pools); **kernels-match-references** needs a reference implementation of each kernel; and
# **matches-reference** needs a dense reference (for a Hugging Face model: `transformers` with K and V fake-quantized
# as the cache stores them). docs/hunt.md has the adapter interface.

# %% [markdown]
# ## 10. A hunt on a checkpoint directory
#
# Everything above hunts minikv's shipped models, whose prompts come from their tasks. The same hunter takes a
# checkpoint directory in transformers' format: `hunt(model=DIR)` (on the command line, `minikv hunt --model DIR`)
# draws the prompts from the directory's own tokenizer (prompts it writes back unchanged), the cells from its
# config, and the dense reference from the same weights. Here a user's model, made up in a few lines: a random
# Gemma-4 of five layers, the last two sharing KV, saved as `config.json` + `model.safetensors`, with a byte-level
# BPE `tokenizer.json` trained with the `tokenizers` library.

# %%
import tempfile

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from minikv.models.gemma4 import Gemma4Config, Gemma4ForCausalLM
from minikv.models.hf_checkpoint import save_checkpoint
from minikv.hunt.strategies import cell_label

MY_MODEL = Path(tempfile.mkdtemp()) / "my-gemma4"
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
corpus = [" ".join(str(a + i * d) for i in range(8)) for a in range(0, 900, 37) for d in (3, 11, 29)]
bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>"],
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                    show_progress=False))
S, F = "sliding_attention", "full_attention"
config = {"model_type": "gemma4_text", "vocab_size": 320, "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 5, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
          "global_head_dim": 32, "layer_types": [S, S, F, S, F], "sliding_window": 8, "num_kv_shared_layers": 2,
          "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 320, "max_position_embeddings": 128,
          "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
torch.manual_seed(0)
net = Gemma4ForCausalLM(Gemma4Config.from_hf_dict(config))
with torch.no_grad():                      # random weights, norms included: nothing hides behind an identity
    for p in net.parameters():
        p.copy_(torch.randn(p.shape) * (0.3 if p.dim() == 1 else 0.25) + (p.dim() == 1))
save_checkpoint(net, MY_MODEL, dtype=torch.bfloat16)
bpe.save(str(MY_MODEL / "tokenizer.json"))
print(sorted(p.name for p in MY_MODEL.iterdir()))

# %% [markdown]
# Its cells beside the shipped models', and what its tokenizer makes of the prompts (numbers merge into tokens):

# %%
# float32 only: float16 on a CPU rounds differently with and without AVX-512, enough to move an fp8 code across
# a rounding boundary and the logits of this small random model past the fp8 x float16 tolerance on some machines
mine = hunt(cells=cells(models=[str(MY_MODEL.resolve())], dtypes=["float32"]), max_scenarios=24, budget_s=None,
            progress=False)
print("shipped: ", ", ".join(sorted({cell_label(c).split(" x ")[0] for c in cells()})), f"({len(cells())} cells)")
print("mine:    ", ", ".join(sorted({cell_label(c).split(" x ")[0] for c in mine.cells})), f"({len(mine.cells)} cells)")
tok = minikv.models.registry.get_tokenizer(MY_MODEL)
for prompt in prompt_pool(str(MY_MODEL.resolve()))[:3]:
    print(f"  {prompt!r}: {len(tok.encode(prompt))} tokens, round-trips: {tok.decode(tok.encode(prompt)) == prompt}")
print(mine.text(portable=True))
assert not mine.found and mine.refused == 0

# %% [markdown]
# The fixed engine comes out clean on it, in float32. (In float16, whether the hunter calls one fp8 scenario's
# logits "too far" from the dense model's depends on the CPU's instruction set: the two sides differ by less than a
# float16 rounding, which can flip one fp8 code, and on this small random model one code moves the logits by about
# the tolerance. The hunt is kept to float32 here so that this notebook says the same thing on every machine.)
# With the scale wipe switched back on, the hunter finds it on this model
# too, blind, and its reproduction fails when run as printed; the cross defects it refuses, naming the kind of
# model they need (this one has no cross attention):

# %%
my_wipe = hunt(model=MY_MODEL, reintroduce=("scale-wipe",), max_scenarios=48, budget_s=None, progress=False)
f = my_wipe.finding
print(f"found: {my_wipe.found}, in cell {cell_label(f.cell)}, by "
      f"{', '.join(dict.fromkeys(v.oracle for v in f.violations))}")
status, _ = run_as_printed(f.snippet)
print(f"its reproduction, run as printed: exit status {status}")
try:
    hunt(model=MY_MODEL, reintroduce=("cross-stride",), max_scenarios=8, budget_s=None, progress=False)
except ValueError as err:
    print("refused:", str(err).split("its first refusal: ")[-1])
search_map({"my-gemma4, the fixed engine": mine, "my-gemma4, scale-wipe reintroduced": my_wipe})

# %% [markdown]
# On the command line, the same is `minikv hunt --model DIR --reintroduce scale-wipe --results hunt.json --plot
# map.png`; docs/hunt.md says what each word of its output means.
#
# ## 11. Exercises
#
# Two exercises, in the style of the other notebooks: put your answer into the first cell (replace `None`) and run
# it; the second cell runs the hunter's pieces on it and says whether it does what was asked, without showing how;
# the third is a worked solution, folded (in JupyterLab, click the bar left of it; on the docs site, click
# "Solution"). The notebook tests run all three with no answer filled in.
#
# **Exercise 1: plant a defect only the byte diff sees.** Write an instrument, a function that takes an engine
# and changes it, like `skip_scale_write_in_last_pool` in section 8: its cache writer stores every row it is given
# where it belongs, *and* stores the same row again one slot further on (a slot of -1 means "write nothing" and
# must stay -1). The check runs one request with your instrument and says whether writes-in-bounds fails while
# the request's tokens stay exactly the fixed engine's.

# %% tags=["exercise"]
my_answer_1 = None          # your answer: a function instrument(llm), built with wrap_kernel_op

# %% tags=["check"]
from minikv.viz.exercises import check

ONE = Scenario("tiny-gemma4", "int8_per_token_head", requests=(Request(prompt_pool("tiny-gemma4")[0], 3),))
FIXED_RUN = MinikvEngine().run(ONE)


def only_the_byte_diff_sees(instrument, _expected=None):
    run = MinikvEngine(instrument=instrument).run(ONE)
    fails = {name for name, o in oracles.ORACLES.items() if not o.needs_reference and o.check(run, {})}
    same_tokens = [r.token_ids for r in run.requests] == [r.token_ids for r in FIXED_RUN.requests]
    return fails == {"writes-in-bounds"} and same_tokens


check("Exercise 1", my_answer_1, True, same=only_the_byte_diff_sees)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: wrap write_kv and call the original twice, the second time with every real slot moved up by one. The
# extra row lands in a slot the step's slot mapping does not name, so the arena's byte diff reports it at once;
# the tokens do not change, because attention reads a slot only after the engine has written that slot itself
# (the next token overwrites the stray row before anything reads it).
def write_one_slot_further(llm):
    def make(write_kv):
        def planted(key, value, pool, slot_mapping, spec, *args, **kwargs):
            write_kv(key, value, pool, slot_mapping, spec, *args, **kwargs)
            further = torch.where(slot_mapping >= 0, slot_mapping + 1, slot_mapping)
            write_kv(key, value, pool, further, spec, *args, **kwargs)
        return planted
    wrap_kernel_op(llm, "write_kv", make)


planted_run = MinikvEngine(instrument=write_one_slot_further).run(ONE)
assert only_the_byte_diff_sees(write_one_slot_further) and not only_the_byte_diff_sees(None)
print("answer: writes-in-bounds fails,", oracles.ORACLES["writes-in-bounds"].check(planted_run, {})[0].summary,
      "- and the tokens equal the fixed engine's")

# %% [markdown]
# **Exercise 2: write an oracle.** Every inline scale an engine stores is a token's amax / QMAX, kept above a small
# epsilon, so a scale that is zero, negative, infinite or NaN means a write went wrong, whatever the defect. Write
# an oracle `scales_valid(run, refs)` that returns a list of problems (empty when the invariant holds): it reads
# the records of section 9, where `KVRow.scales` holds each position's scales as 4-byte little-endian fp32 values
# (`struct.unpack`), and is empty for a format without scales. The check runs it on a few runs, real and written
# by hand, and says whether it flags exactly the broken ones.

# %% tags=["exercise"]
my_answer_2 = None          # your answer: a function scales_valid(run, refs) -> list of problems

# %% tags=["check"]
import struct


def records(*scales):
    """A hand-written run: one request whose first pool holds one position per scales value given."""
    rows = tuple(KVRow(codes=b"\x10\x7f", scales=b) for b in scales)
    return Run(Scenario("their-model", "int8_per_token_head"),
               requests=[dataclasses.replace(first, kv={"layer.2": rows})])


CASES = {
    "the fixed engine's run": FIXED_RUN,
    "section 9's records": other,
    "a 16-bit cache (no scales)": Run(Scenario("their-model", "auto"), requests=[dataclasses.replace(
        first, kv={"layer.2": (KVRow(codes=b"\x10\x7f\x00\x3c"),)})]),
    "one zero scale": records(struct.pack("<f", 0.0)),
    "a NaN among good scales": records(struct.pack("<2f", 0.01, 0.02), struct.pack("<2f", 0.01, float("nan"))),
    "a negative scale": records(struct.pack("<f", -0.5)),
}
BROKEN = {"one zero scale", "a NaN among good scales", "a negative scale"}


def flags_exactly_the_broken(oracle, broken):
    return {name for name, run in CASES.items() if oracle(run, {})} == broken


check("Exercise 2", my_answer_2, BROKEN, same=flags_exactly_the_broken)

# %% jupyter={"outputs_hidden": true, "source_hidden": true} tags=["solution"]
# Solution: unpack each position's scales and test them. It needs nothing but the records, so it transfers to
# another engine as repeat-identical does. It would not have caught the scale wipe (1.0 is a valid scale): an
# invariant catches a class of defects, and the wipe's class is "the same request, different bytes".
import math


def scales_valid(run, refs):
    problems = []
    for request in run.requests:
        for pool, rows in (request.kv or {}).items():
            for position, row in enumerate(rows):
                values = struct.unpack(f"<{len(row.scales) // 4}f", row.scales)
                if not all(math.isfinite(v) and v > 0 for v in values):
                    problems.append(f"request {request.index}, {pool}, position {position}: scales {values}")
    return problems


assert flags_exactly_the_broken(scales_valid, BROKEN)
print("answer: flags", ", ".join(sorted(BROKEN)), "- and holds on the fixed engine's run")

# %% [markdown]
# **More to try** (no check cell):
#
# 1. Run `minikv hunt --reintroduce scale-wipe --oracle schedule-invariant`. Does the invariant find the wipe on its
#    own? What would a scenario need for it to (think about which copy of a request runs in the first batch)?
# 2. Plant `last_scale_to_wrong_slot` from `tests/test_hunt_planted.py` here and hunt it. Which two invariants
#    fail, and why does the byte diff see it before any token goes wrong?
# 3. Shrinking stops after `max_shrink_runs` runs. Hunt the scale wipe with `max_shrink_runs=0` and compare the
#    reproduction with the one above.
