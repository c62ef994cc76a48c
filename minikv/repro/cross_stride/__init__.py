"""`minikv repro cross-stride`: defects B1 (cross-stride) and B2 (cross-fp8-context-read) on tiny-t5.
See docs/internals.md#repro-cross-stride."""
from __future__ import annotations

# The names the notebooks, the docs hooks, the tests and the tools use, from the module that defines each.
from .arena import byte_arrangement, check_arena_runs, format_arena_runs, fp8_row_read, overrun_facts  # noqa: F401
from .cli import main  # noqa: F401
from .context_read import run_context  # noqa: F401
from .report import (check_signatures, error_display, factor_key, measure, quantities, results_dict,  # noqa: F401
                     tables, write_results)
from .run import (MODEL, bind_time_check, engine, generate_tokens, make_prompts, model_dtype,  # noqa: F401
                  reference_tokens, references, run_pool, task_of)
