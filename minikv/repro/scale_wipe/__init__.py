"""`minikv repro scale-wipe`: defect A, buggy and fixed, over max_num_seqs x prefix caching x cache format.
See docs/internals.md#repro-scale-wipe."""
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
