"""`minikv repro scale-wipe`: defect A, buggy and fixed, over max_num_seqs x prefix caching x cache format.

`--model` picks what runs: tiny-gemma4 (the default: trained, 8 layers, two sharers per shared storage),
tiny-gemma4-e2b (gemma-4-E2B's 35-layer topology with random weights: upstream's census, 33 harmless fills and 2
that wipe), or a checkpoint directory in transformers' format (a Gemma-4 text model with its own tokenizer, e.g.
gemma-4-E2B-it; prompts from `minikv.tasks.for_checkpoint`, which adapts them to the tokenizer).

For every configuration a fixed engine and a buggy engine (`reintroduce=("scale-wipe",)`) serve the same
requests. A request is *damaged* when the buggy engine's answer is wrong by the task's check and differs from
the fixed engine's; for a model whose answers cannot be judged right (random weights, or a checkpoint directory
whose fixed engine does not answer every prompt right) it is damaged when its token ids differ from the fixed
engine's (`Run.judge`: "task" or "fixed run"). After the first forward step, the K/V of the first batch's prompt are read back from the
KV-sharing targets' pools of both engines: the ratio of their magnitudes is the measured inflation, compared
with 1 / (the true scale the fixed engine stored).

Upstream signatures checked (exit status 0 only if all hold): the buggy engine damages exactly the first
max_num_seqs requests with prefix caching off (at least those with it on; carrying the damage to later requests
through the prefix cache is minikv's own observation, upstream called the prefix-caching correlation spurious),
later batches stay clean, the fills that wipe written scales are late fills of KV-sharing layers, the inflation
equals 1 / true scale, a 16-bit cache is untouched by the switch, and every fixed run has zero damaged requests.

Then smaller tables:
* the census per warmup shape, minikv's reading of upstream's "(pre-write)" tag: which fills come before the
  first write to their storage, which come after it and find nothing left to wipe, which wipe;
* prefix caching and request order: which order of the copies and which prompt lengths give "exactly the first
  batch" (upstream's report) and which carry the damage to copies that reuse wiped blocks;
* warmup shape: the same buggy engine with a capture-shaped warmup (every layer run with attention metadata)
  damages nothing;
* sleep / wake_up: in both sleep modes the fixed engine initializes every scale region again; with nothing
  re-initializing after a same-address wake (a registry keyed by (data_ptr, nbytes) alone) the scale slots stay
  0 - which no minikv kernel reads; the historical engine's wipe is not re-armed by a wake-up;
* who reads unwritten scale slots (`minikv.repro.unwritten_slots`);
* arrival timing: requests arrive over several steps (seeded) through the step API; the damaged set is exactly the
  first scheduled batch, whatever it holds - why upstream saw the bug as stochastic under multiprocess serving.

The reproduction's modules, in the order a reader meets them: `run` (the engines and what they served),
`census` (the scale fills against upstream's, the main table), `report` (one number per quantity, the JSON
results), `experiments` (arrival timing, warmup shapes, prefix caching, sleep / wake-up), `cli` (the command).
Their public names are importable from `minikv.repro.scale_wipe` itself.
"""
from __future__ import annotations

# The names the notebooks, the docs hooks, the tests and the CLI use, from the module that defines each.
from .census import (UPSTREAM_CENSUS, census_counts, census_rows, check_census, check_signatures,  # noqa: F401
                     code_site_diff, format_census, format_table, times)
from .cli import main  # noqa: F401
from .experiments import (arrival_run, check_prefix_runs, check_warmup_census, format_arrivals,  # noqa: F401
                          format_prefix_reuse, format_prefix_runs, format_warmup_census, prefix_caching_runs,
                          prefix_reuse, warmup_census)
from .report import format_quantities, headline_pair, quantities, upstream_rows  # noqa: F401
from .run import (E2B_MODEL, FORMATS, MODEL, Fill, Run, attention_damage, census_fills, compare, judge_of,  # noqa: F401
                  layer_index, make_prompts, run_engine)
