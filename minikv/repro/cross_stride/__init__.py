"""`minikv repro cross-stride`: defects B1 (cross-stride) and B2 (cross-fp8-context-read) on tiny-t5.

`--model DIR` runs the same on a T5 checkpoint directory in transformers' format (e.g. flan-t5-base, with its
own tokenizer.json; prompts from `minikv.tasks.for_checkpoint`, which adapts them to the tokenizer). Every
signature compares token ids with the auto-cache run, so it needs no right/wrong answers.

tiny-t5 is a T5 (3 encoder + 3 decoder layers, so three cross-attention layers, each with its own cross pool). It
runs here as a 16-bit model (float16 on CPU, bfloat16 on CUDA), as flan-t5-base did upstream: the historical
cross backend addresses a 1-byte fp8 pool at the model's element size, 2 bytes. (A float32 model would address it
at 4 bytes, and take the unfused context path, where B2 cannot happen.)

B1 table. The same requests run with an fp8 cache on cross pools of 0.75, 1, 1.5, 1.99, 2 and 3 times the blocks
they need at once, buggy (`reintroduce=("cross-stride",)`, layout contract off so the bind succeeds as it did
upstream) and fixed, with the arena's sanitizer on and off. Outcomes: "correct" (token ids equal the auto-cache
run), "overrun caught" (KVCacheOverrunError naming the cross pool), "wrong tokens" (the overrun landed on live data),
"correct, guard hit" (sanitizer off: the overrun happened but landed only in a guard zone, harming nothing). Plus the
layout contract catching the buggy backend at bind time.

B2 table. With the addressing fixed, the cross-attention output of every step is compared with attention over
the exact encoder K/V: the historical fused path (reads the fp8 bytes of the right blocks as 16-bit elements
unless paged_context is on), the upstream fallback (unfused context path), and minikv's fused path taught the
cache format. The last column is the farthest pool byte the fused context read addresses: inside the pool.

Exit status 0 only if: buggy pools >= 2x are correct and smaller ones overrun (caught with the sanitizer on,
wrong tokens with it off), never outside the arena; the layout contract raises at bind; the historical context
read is wrong at the context step and right at decode steps; every fixed run equals the auto-cache run.

`--results PATH` also writes the measured quantities and tables as JSON (results/cross_stride.json; its shape is
described in `results_dict`); notebook 04 prints the same `display` strings from the same functions.

The reproduction's modules: `run` (B1's pool runs), `context_read` (B2's), `arena` (where the doubled stride
lands, one arena or one allocation per pool), `report` (signatures, tables, quantities, the JSON results),
`cli` (the command). Their public names are importable from `minikv.repro.cross_stride` itself.
"""
from __future__ import annotations

# The names the notebooks, the docs hooks, the tests and the tools use, from the module that defines each.
from .arena import byte_arrangement, check_arena_runs, format_arena_runs, fp8_row_read, overrun_facts  # noqa: F401
from .cli import main  # noqa: F401
from .context_read import run_context  # noqa: F401
from .report import (check_signatures, error_display, factor_key, measure, quantities, results_dict,  # noqa: F401
                     tables, write_results)
from .run import (MODEL, bind_time_check, engine, generate_tokens, make_prompts, model_dtype,  # noqa: F401
                  reference_tokens, references, run_pool, task_of)
