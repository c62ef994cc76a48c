"""The H200 benchmark as a results source: notebooks/data/gpu_attention.csv (the CSV notebook 05 draws) and
gpu_decode_step.csv; the targets come from `minikv.bench.attention.targets`, the function the benchmark prints
them with."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

from .schema import ResultsError, slug

GPU_CSV = Path("notebooks/data/gpu_attention.csv")
GPU_STEP_CSV = Path("notebooks/data/gpu_decode_step.csv")
SHORT_FORMAT = {"auto": "bf16", "fp8": "fp8 (per tensor)", "int8_per_token_head": "int8 p.t.h. row",
                "int8_per_token_head/block": "int8 p.t.h. block", "fp8_per_token_head": "fp8 p.t.h. row",
                "fp8_per_token_head/block": "fp8 p.t.h. block"}
_TEXT_COLUMNS = ("kind", "format", "gpu", "torch", "triton", "timing", "sdpa_timing", "kernel", "mode",
                 "flashinfer", "flashinfer_variant", "flashinfer_timing", "engine_path")


def _number(value: str):
    try:
        return float(value)
    except ValueError:
        return value


def _read_csv(path: Path) -> list[dict]:
    """The rows, numbers as floats; the known text columns, empty cells and any other text (a column a newer run
    added, such as the kernel that served a case) stay strings."""
    with open(path, newline="") as f:
        return [{k: (v if k in _TEXT_COLUMNS or v == "" else _number(v)) for k, v in row.items()}
                for row in csv.DictReader(f)]


def _ratio(x: float) -> str:
    return f"{x:.2f}x"


def load_gpu(repo: Path) -> dict | None:
    path = repo / GPU_CSV
    if not path.exists():
        return None
    rows = _read_csv(path)
    decode = [r for r in rows if r["kind"] == "decode"]
    if not decode:
        raise ResultsError(f"{path}: no decode rows")
    first = rows[0]
    ms = {(r["format"], int(r["batch"]), int(r["context"])): r for r in decode}
    formats = list(dict.fromkeys(r["format"] for r in decode))
    shapes = sorted({(b, c) for _, b, c in ms})
    q = {
        "device": {"value": first["gpu"], "display": f"{first['gpu']}, torch {first['torch']}, triton {first['triton']}",
                   "statistic": "the GPU and the software of the run"},
        "copy_GBps": {"value": first["copy_GBps"], "display": f"{first['copy_GBps']:,.0f} GB/s",
                      "statistic": "device-to-device copy bandwidth (bytes read + written per second), same run"},
        "read_GBps": {"value": first["read_GBps"], "display": f"{first['read_GBps']:,.0f} GB/s",
                      "statistic": "read-only pass bandwidth, same run"},
    }

    def speedup(f, b, c):
        return ms[("auto", b, c)]["ms"] / ms[(f, b, c)]["ms"]

    for (f, b, c), r in ms.items():
        tag = f"{slug(f)}_b{b}_c{c}"
        q[f"us_{tag}"] = {"value": 1e3 * r["ms"], "display": f"{1e3 * r['ms']:,.1f} µs",
                          "statistic": f"median paged decode time, {f}, batch {b}, context {c}"}
        q[f"pct_copy_{tag}"] = {"value": r["pct_copy"], "display": f"{r['pct_copy']:.0f}%",
                                "statistic": f"achieved bandwidth as a share of the copy ceiling, {f}, batch {b}, "
                                             f"context {c}"}
        q[f"x_sdpa_{tag}"] = {"value": r["sdpa_over_minikv"], "display": _ratio(r["sdpa_over_minikv"]),
                              "statistic": f"SDPA time (contiguous bf16) / minikv time, {f}, batch {b}, context {c}"}
        if ("auto", b, c) in ms:
            s = speedup(f, b, c)
            q[f"x_bf16_{tag}"] = {"value": s, "display": _ratio(s),
                                  "statistic": f"bf16 paged decode time / {f} time, batch {b}, context {c}"}
    big = [(b, c) for b, c in shapes if b >= 16 and c >= 4096]
    for f in formats:
        if f.endswith("/block") and all((f, b, c) in ms and (f[:-6], b, c) in ms for b, c in big) and big:
            gains = [ms[(f[:-6], b, c)]["ms"] / ms[(f, b, c)]["ms"] for b, c in big]
            q[f"block_over_row_{slug(f[:-6])}"] = {
                "value": [min(gains), max(gains)], "display": f"{min(gains):.2f}-{max(gains):.2f}x",
                "statistic": f"{f[:-6]}: row-placement time / block-placement time, every shape with batch >= 16 "
                             "and context >= 4096"}
    prefill = {r["format"]: r for r in rows if r["kind"] == "prefill"}
    sdpa = prefill.get("self causal, torch SDPA")
    for name, r in prefill.items():
        if sdpa and r is not sdpa:
            x = r["TFLOPs"] / sdpa["TFLOPs"]
            q[f"prefill_x_sdpa_{slug(name.split(', ', 1)[-1])}"] = {
                "value": x, "display": _ratio(x),
                "statistic": f"causal context attention TFLOP/s / SDPA's, {name}, batch 8, length 4096"}

    headline = [(1, 4096), (16, 512), (16, 4096), (64, 4096), (256, 16384)]
    selected = [("auto", b, c) for b, c in headline if ("auto", b, c) in ms]
    selected += [(f, b, c) for f in formats if f != "auto" for b, c in ((64, 4096), (256, 16384)) if (f, b, c) in ms]
    decode_table = {
        "caption": "Paged decode, 32 query heads, 8 KV heads, head size 128, block size 16, shuffled blocks "
                   "(median of 20 CUDA-graph replays, L2 flushed before each)",
        "columns": ["format", "batch", "context", "minikv µs", "GB/s", "% of copy", "x bf16 paged", "SDPA µs",
                    "SDPA / minikv"],
        "rows": [[f, b, c, f"{1e3 * ms[(f, b, c)]['ms']:.1f}", f"{ms[(f, b, c)]['GBps']:,.0f}",
                  f"{ms[(f, b, c)]['pct_copy']:.0f}%",
                  _ratio(speedup(f, b, c)) if ("auto", b, c) in ms else "–",
                  f"{1e3 * ms[(f, b, c)]['sdpa_ms']:.1f}", f"{ms[(f, b, c)]['sdpa_over_minikv']:.2f}"]
                 for f, b, c in selected]}
    every = {"caption": "Every decode shape: µs (and how many times faster than bf16 paged decode)",
             "columns": ["batch", "context", *[SHORT_FORMAT.get(f, f) for f in formats]],
             "rows": [[b, c, *[f"{1e3 * ms[(f, b, c)]['ms']:.1f} ({speedup(f, b, c):.2f}x)" if (f, b, c) in ms
                               else "–" for f in formats]] for b, c in shapes]}
    context = {"caption": "Context attention",
               "columns": ["case", "batch", "q_len", "kv_len", "ms", "TFLOP/s"],
               "rows": [[r["format"], int(r["batch"]), int(r["q_len"]), int(r["context"]), f"{r['ms']:.3f}",
                         f"{r['TFLOPs']:.1f}"] for r in rows if r["kind"] in ("prefill", "cross-context")]}
    tables = {"decode": decode_table, "decode_every_shape": every, "context": context}
    engine = [r for r in rows if r["kind"] == "engine-decode" and isinstance(r.get("tokens_per_s"), float)]
    for r in engine:
        r.setdefault("mode", "eager")        # CSVs from before the engine had CUDA graphs: every step eager

    def engine_base(r):         # a capacity row against bf16's capacity row, a peer row against transformers' eager
        same = ("mode",) if r["mode"] in ("capacity", "peer") else ("batch", "context", "mode")
        return next((x["tokens_per_s"] for x in engine if x["format"] == "auto"
                     and all(x[k] == r[k] for k in same)), None)
    if engine:
        order, last = {"replayed": 0, "eager": 1}, {"peer": 1, "capacity": 2}     # peers and capacity at the end
        listed = sorted(engine, key=lambda r: (last.get(r["mode"], 0), -r["batch"], r["context"],
                                               order.get(r["mode"], 2)))
        tables["engine"] = {
            "caption": "The engine: decode tokens/s per format, context and mode (`python -m minikv.bench attention "
                       "--engine`, the engine-decode rows of the CSV; replayed: CUDA graphs, eager: "
                       "enforce_eager=True, sdpa-graph: the same model's step with torch SDPA over a contiguous "
                       "bf16 cache, captured; vs bf16: against bf16 at the same batch, context and mode; peer: "
                       "`--peer transformers`, each engine against transformers' eager generate; capacity: the most "
                       "sequences whose K/V fits the budget, against bf16's capacity row)",
            "columns": ["kv_cache_dtype", "batch", "context", "mode", "ms / step", "tokens/s", "vs bf16",
                        "prefill tokens/s"],
            "rows": [[r.get("engine") or r["format"], int(r["batch"]), int(r["context"]), r["mode"], f"{r['ms']:.2f}",
                      f"{r['tokens_per_s']:,.0f}", _ratio(r["tokens_per_s"] / engine_base(r)) if engine_base(r)
                      else "–", f"{r['prefill_tokens_per_s']:,.0f}" if isinstance(r.get("prefill_tokens_per_s"),
                                                                                 float) else "–"]
                     for r in listed]}
        main = engine[0]        # the engine bench measures its main batch and context first
        for r in engine:
            if (r["batch"], r["context"], r["mode"]) == (main["batch"], main["context"], main["mode"]):
                x = r["tokens_per_s"] / engine_base(r)
                q[f"engine_x_bf16_{slug(r['format'])}"] = {
                    "value": x, "display": _ratio(x),
                    "statistic": f"engine decode tokens/s of {r['format']} / bf16's, batch {int(r['batch'])}, "
                                 f"context {int(r['context'])}, {r['mode']}"}
    peer = [r for r in decode if isinstance(r.get("flashinfer_ms"), float)]
    if peer:
        tables["flashinfer"] = {
            "caption": f"Against FlashInfer {peer[0].get('flashinfer', '')}'s paged decode on the same pools, block "
                       "tables and queries (`--peer flashinfer`: the faster of its tensor-core and CUDA-core "
                       "variants; max |diff|: its output against minikv's)",
            "columns": ["format", "batch", "context", "minikv µs", "FlashInfer µs", "FlashInfer / minikv",
                        "FlashInfer variant", "max abs diff"],
            "rows": [[r["format"], int(r["batch"]), int(r["context"]), f"{1e3 * r['ms']:.1f}",
                      f"{1e3 * r['flashinfer_ms']:.1f}", f"{r['flashinfer_over_minikv']:.2f}",
                      r["flashinfer_variant"], f"{r['flashinfer_max_abs_diff']:.2g}"] for r in peer]}
    try:
        sys.path.insert(0, str(repo))
        from minikv.bench.attention import format_ratio, targets  # the definitions the benchmark prints
        from minikv.bench.engine import targets as engine_targets
    except ImportError as e:
        raise ResultsError(f"cannot import minikv.bench.attention for the GPU targets ({e}); run inside .venv") from e
    finally:
        sys.path.pop(0)
    tables["targets"] = {
        "caption": "The performance targets, each a ratio within one run or one part of it (ratios rounded down to "
                   "three decimals, as `minikv.bench.attention.format_ratio` prints them)",
        "columns": ["target", "goal", "measured", "verdict"],
        "rows": [[what, f"{goal:.2f}x", format_ratio(value), "met" if value >= goal else "missed"]
                 for what, value, goal in targets(rows) + (engine_targets(engine) if any(
                     "decode_tokens_per_s" in r for r in engine) else [])]}
    step_path = repo / GPU_STEP_CSV
    if step_path.exists():
        with open(step_path, newline="") as f:
            steps = list(csv.DictReader(f))
        base = float(steps[0]["tokens_per_s"])
        tables["decode_step"] = {
            "caption": "A model-sized decode step (Llama-like, 1.4B parameters, random weights, 16 layers, batch 64, "
                       "context 4096, CUDA graph; `python -m minikv.bench.decode_step`)",
            "columns": ["kv_cache_dtype", "ms / step", "tokens/s", "vs bf16"],
            "rows": [[r["format"], f"{float(r['ms_per_step']):.2f}", f"{float(r['tokens_per_s']):,.0f}",
                      _ratio(float(r["tokens_per_s"]) / base)] for r in steps]}
        for r in steps:
            x = float(r["tokens_per_s"]) / base
            q[f"step_x_bf16_{slug(r['format'])}"] = {"value": x, "display": _ratio(x),
                                                      "statistic": f"decode-step tokens/s of {r['format']} / bf16's"}
    return {"name": "gpu", "command": "python -m minikv.bench attention --engine --peer flashinfer --csv "
                                      "notebooks/data/gpu_attention.csv",
            "quantities": q, "tables": tables,
            "_source": "`notebooks/data/gpu_attention.csv` (`bash tools/gpu.sh bench` on the GPU named above: `python -m "
                       "minikv.bench attention --engine --peer flashinfer`, with parts added by `--engine-only`) and "
                       "`gpu_decode_step.csv` "
                       "(`python -m minikv.bench.decode_step`, an earlier run)"}


# ---- the shipped models -------------------------------------------------------------------------------------------
