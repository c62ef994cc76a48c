"""The results sources tools/render_results.py quotes, each turned into the same shape {"name", "command",
"quantities", "tables"}: the reproductions (`reproductions`), the H200 benchmark (`gpu_bench`), the shipped models
and the CPU's timed runs (`cpu_runs`). `load_sources` reads every one whose files exist."""
from __future__ import annotations

from pathlib import Path

from .cpu_runs import CI_RUN, CPU_BENCH, MAKE_RUN, load_cpu_speed, load_make_run, load_models, load_test_time
from .gpu_bench import GPU_CSV, GPU_STEP_CSV, load_gpu
from .reproductions import compare_cpu_gpu, load_cross_stride_cuda, load_results, load_scale_wipe_cuda, parse_cross_log
from .schema import REPO, REQUIRED_KEYS, ResultsError, cell, check_shape, read_json, slug

__all__ = ["CI_RUN", "CPU_BENCH", "MAKE_RUN", "GPU_CSV", "GPU_STEP_CSV", "REPO", "REQUIRED_KEYS", "ResultsError",
           "cell", "check_shape", "compare_cpu_gpu", "load_cpu_speed", "load_cross_stride_cuda", "load_gpu",
           "load_make_run", "load_models", "load_results", "load_scale_wipe_cuda", "load_sources", "load_test_time",
           "parse_cross_log", "read_json", "slug"]


def load_sources(repo: Path = REPO) -> dict[str, dict]:
    """Every results source of the repository: results/*.json, then the derived ones whose files exist."""
    out = load_results(repo / "results")
    for loader in (load_scale_wipe_cuda, load_cross_stride_cuda, load_gpu, load_models, load_cpu_speed,
                   load_test_time, load_make_run):
        data = loader(repo)
        if data is not None:
            out[data["name"]] = data
    both = compare_cpu_gpu(out, out)
    if both is not None:
        out["cpu_vs_gpu"] = both
    return out
