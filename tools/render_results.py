"""Write the measured figures of the results sources into README.md and docs/**/*.md (one number per quantity).

    python tools/render_results.py            # rewrite every results block in place
    python tools/render_results.py --check    # change nothing; exit 1 and name the files that are out of date
    python tools/render_results.py --list     # print every name a block may use

A page quotes a figure through a marked block, which this tool fills from its source, so the prose and the tables
cannot drift from the computation:

    <!-- results:scale_wipe.tables.damage -->          a table, on lines of its own: its caption, the Markdown
    ...                                                 table and its source (everything between the markers is
    <!-- /results -->                                   replaced)

    the wiped K grows by <!-- results:scale_wipe.quantities.k_inflation -->x41<!-- /results -->

A quantity is replaced by its `display` string. An inline quantity block never starts a line: a line that starts
with an HTML comment is an HTML block to Markdown (on the built site and on GitHub), which splits the paragraph.
A table block's markers stand alone on their lines. Both rules are errors here, with the file and the line.

The sources, each turned into the same shape {"name", "command", "quantities", "tables"}:

* `results/NAME.json`: what `make results` writes (the reproductions on the CPU; CONTRIBUTING.md, "Results files");
* `scale_wipe_cuda`, `cross_stride_cuda`: the same reproductions on an H200, `results/gpu/scale_wipe_cuda.json`
  and `results/gpu/cross.log` (the command's printed tables, parsed);
* `cpu_vs_gpu`: the two side by side, each row marked as a categorical outcome (the same on both) or a float
  magnitude (which differs with the device and the model dtype);
* `gpu`: the H200 benchmark, `notebooks/data/gpu_attention.csv` (the CSV notebook 05 draws) and
  `gpu_decode_step.csv`; the targets come from `minikv.bench.attention.targets`, the function the benchmark prints
  them with;
* `models`: the shipped models' evaluations, `minikv/models/weights/*/training.json`;
* `cpu_speed`: `python -m minikv.bench engine`'s output, `results/cpu/bench_engine.log`;
* `test_time`: CI's job timed from a fresh clone, `results/cpu/ci_run.log` (`bash tools/time_fresh_clone.sh`).
* `make_run`: `make run` timed once, `results/cpu/make_run.log` (`/usr/bin/time -v make run`, with the load average
  before and after).

Rendering is idempotent: a second run changes nothing. A name that no source defines is an error that names the
file, the line and the names that do exist.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- results:(?P<name>[^\s>]*) -->(?P<body>.*?)<!-- /results -->", re.DOTALL)
REQUIRED_KEYS = ("name", "command", "quantities", "tables")


class ResultsError(ValueError):
    """A results source or a results block that cannot be used; the message says what to fix."""


def _check_shape(data: dict, where: str, stem: str) -> dict:
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ResultsError(f"{where}: missing key(s) {missing}; a results file needs {list(REQUIRED_KEYS)}")
    if data["name"] != stem:
        raise ResultsError(f"{where}: \"name\" is {data['name']!r} but the file stem is {stem!r}; "
                           "they must be the same")
    for q, entry in data["quantities"].items():
        if not isinstance(entry, dict) or not isinstance(entry.get("display"), str):
            raise ResultsError(f"{where}: quantity {q!r} needs a \"display\" string")
    for t, table in data["tables"].items():
        if not isinstance(table, dict) or not {"columns", "rows"} <= set(table):
            raise ResultsError(f"{where}: table {t!r} needs \"columns\" and \"rows\"")
        bad = [i for i, row in enumerate(table["rows"]) if len(row) != len(table["columns"])]
        if bad:
            raise ResultsError(f"{where}: table {t!r}: row(s) {bad} do not have {len(table['columns'])} cells")
    return data


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON ({e}); re-run the command that writes it") from e


def load_results(results_dir: Path) -> dict[str, dict]:
    """Every results/NAME.json, checked for the schema's shape, keyed by NAME."""
    return {path.stem: _check_shape(_read_json(path), str(path), path.stem)
            for path in sorted(Path(results_dir).glob("*.json"))}


# ---- the reproductions on the GPU ------------------------------------------------------------------------------

def load_scale_wipe_cuda(repo: Path) -> dict | None:
    path = repo / "results" / "gpu" / "scale_wipe_cuda.json"
    if not path.exists():
        return None
    data = _read_json(path)
    data = dict(data, name="scale_wipe_cuda",        # the repro's own results file, run on CUDA
                _source=f"`results/gpu/scale_wipe_cuda.json`, written by `{data.get('command', '?')}` on an H200")
    return _check_shape(data, str(path), "scale_wipe_cuda")


_B1_ROW = re.compile(r"^\s*(?P<factor>[\d.]+)x\s+(?P<blocks>\d+) \| (?P<cells>.*)$")
_B2_VERSIONS = ("historical", "fallback", "taught-fused")


def _split_columns(text: str) -> list[str]:
    return [c.strip() for c in re.split(r"\s{2,}", text.strip()) if c.strip()]


def _outcome(cell: str) -> tuple[str, str]:
    """'wrong tokens (6/6 requests)' or 'wrong tokens (6 of 6)' -> ('wrong tokens', '6 of 6')."""
    m = re.match(r"(?P<what>[^()]*?)\s*\((?P<a>\d+)(?:/| of )(?P<b>\d+)(?: requests)?\)$", cell)
    if m:
        return m.group("what"), f"{m.group('a')} of {m.group('b')}"
    return cell, ""


def parse_cross_log(text: str, where: str = "results/gpu/cross.log") -> dict:
    """The tables `minikv repro cross-stride` prints (B1 pool sizes, B2 context paths, identical requests)."""
    b1, b2, copies = [], [], []
    for line in text.splitlines():
        m = _B1_ROW.match(line)
        if m:
            cells = _split_columns(m.group("cells"))
            if len(cells) != 4:
                raise ResultsError(f"{where}: a B1 row needs 4 outcomes, got {cells!r} in {line!r}")
            b1.append((float(m.group("factor")), int(m.group("blocks")), cells))
            continue
        cols = _split_columns(line)
        if cols and cols[0] in _B2_VERSIONS and len(cols) >= 5:
            b2.append(cols)
        if "blocks (" in line and ":" in line:
            for part in line.strip().split(";"):
                pm = re.match(r"\s*(\d+) blocks \(([\d.]+)x\): (.*)$", part)
                if pm:
                    copies.append((int(pm.group(1)), float(pm.group(2)), pm.group(3).strip()))
    if not b1 or len(b2) != len(_B2_VERSIONS) or not copies:
        raise ResultsError(f"{where}: expected the B1 table, the {len(_B2_VERSIONS)} B2 rows and the identical-request "
                           f"line of `minikv repro cross-stride`; found {len(b1)} B1 rows, {len(b2)} B2 rows, "
                           f"{len(copies)} identical-request entries")
    return {"b1": b1, "b2": b2, "copies": copies}


def load_cross_stride_cuda(repo: Path) -> dict | None:
    path = repo / "results" / "gpu" / "cross.log"
    if not path.exists():
        return None
    parsed = parse_cross_log(path.read_text(errors="replace"), str(path.relative_to(repo)))
    b1 = {"caption": "B1 on the H200 (tiny-t5 in bfloat16): outcome per engine",
          "columns": ["pool factor", "blocks", "buggy, sanitizer on", "buggy, sanitizer off", "fixed, sanitizer on",
                      "fixed, sanitizer off"],
          "rows": [[f"{f:g}x", blocks, *[" ".join(filter(None, (w, f"({n})" if n else ""))) for w, n in
                                          map(_outcome, cells)]] for f, blocks, cells in parsed["b1"]]}
    b2 = {"caption": "B2 on the H200: cross-attention output vs exact attention, max relative error",
          "columns": ["version", "context path", "context step", "decode steps", "token ids = auto"],
          "rows": [cols[:5] for cols in parsed["b2"]]}
    same = {"caption": "three identical requests on the H200, historical stride, sanitizer off",
            "columns": ["blocks", "pool factor", "copies differing"],
            "rows": [[b, f"{f:.2f}x", d] for b, f, d in parsed["copies"]]}
    return {"name": "cross_stride_cuda", "command": "minikv repro cross-stride --device cuda (results/gpu/cross.log)",
            "quantities": {}, "tables": {"b1_pool_sizes": b1, "b2_context_read": b2, "identical_requests": same},
            "parsed": parsed, "_source": "`results/gpu/cross.log`, printed by `minikv repro cross-stride --device cuda` "
                                         "on an H200"}


# ---- CPU next to GPU --------------------------------------------------------------------------------------------

SAME, DIFFERS = "same", "differs"


def _kind_row(what: str, kind: str, cpu: str, gpu: str) -> list[str]:
    verdict = SAME if cpu == gpu else DIFFERS
    return [what, kind, cpu, gpu, verdict]


def compare_cpu_gpu(cpu: dict[str, dict], cuda: dict[str, dict]) -> dict | None:
    """Row by row: each categorical outcome and each float magnitude of the two reproductions, CPU vs H200.

    `cpu` holds results/scale_wipe.json and results/cross_stride.json; `cuda` the scale_wipe_cuda and
    cross_stride_cuda sources. Categorical rows: damaged requests, census counts, B1 outcomes, whether B2's token
    ids equal the auto-cache run, which identical copies differ. Magnitude rows: inflations, relative errors, how
    many requests a silent overrun turns wrong (it depends on the stray bytes' values)."""
    if not {"scale_wipe", "cross_stride"} <= set(cpu) or not {"scale_wipe_cuda", "cross_stride_cuda"} <= set(cuda):
        return None
    rows = []
    cat, mag = "categorical", "float magnitude"
    a, g = cpu["scale_wipe"]["tables"]["damage"], cuda["scale_wipe_cuda"]["tables"]["damage"]
    col = {c: i for i, c in enumerate(a["columns"])}
    for ra, rg in zip(a["rows"], g["rows"]):
        config = f"A: {ra[col['kv_cache_dtype']]}, max_num_seqs {ra[col['max_num_seqs']]}, prefix caching " \
                 f"{ra[col['prefix caching']]}"
        if ra[:3] != rg[:3]:
            raise ResultsError(f"scale wipe damage tables list different configurations: {ra[:3]} vs {rg[:3]}")
        for name, kind in (("damaged (buggy)", cat), ("damaged (fixed)", cat), ("fills that wiped nothing", cat),
                           ("late fills that wiped", cat), ("K inflation", mag), ("V inflation", mag)):
            rows.append(_kind_row(f"{config}: {name}", kind, _cell(ra[col[name]]), _cell(rg[col[name]])))
    cs = cpu["cross_stride"]["tables"]
    parsed = cuda["cross_stride_cuda"]["parsed"]
    gpu_b1 = {f"{f:g}x": cells for f, _, cells in parsed["b1"]}
    heads = cs["b1_pool_sizes"]["columns"][2:]
    for row in cs["b1_pool_sizes"]["rows"]:
        factor = row[0]
        for head, cpu_cell, gpu_cell in zip(heads, row[2:], gpu_b1.get(factor, [""] * len(heads))):
            (cw, cn), (gw, gn) = _outcome(cpu_cell), _outcome(gpu_cell)
            rows.append(_kind_row(f"B1 {factor} pool, {head}: outcome", cat, cw, gw))
            if cn or gn:
                rows.append(_kind_row(f"B1 {factor} pool, {head}: wrong requests", mag, cn or "-", gn or "-"))
    gpu_b2 = {cols[0]: cols for cols in parsed["b2"]}
    for version, path, ctx, dec, wrong in cs["b2_context_read"]["rows"]:
        g2 = gpu_b2.get(version, ["", "", "", "", ""])
        rows.append(_kind_row(f"B2 {version}: context path", cat, path, g2[1]))
        rows.append(_kind_row(f"B2 {version}: token ids equal the auto-cache run", cat,
                              "yes" if wrong.startswith("0 of") else "no", g2[4]))
        rows.append(_kind_row(f"B2 {version}: context-step error", mag, ctx, g2[2]))
        rows.append(_kind_row(f"B2 {version}: decode-step error", mag, dec, g2[3]))
    gpu_copies = {f"{f:.2f}x": d for _, f, d in parsed["copies"]}
    for _, factor, differ in cs["identical_requests"]["rows"]:
        rows.append(_kind_row(f"three identical requests, {factor} pool: copies differing", cat, differ,
                              gpu_copies.get(factor, "")))
    table = {"caption": "The reproductions on the CPU (torch backend; tiny-t5 in float16) and on the H200 (compiled "
                        "Triton kernels; tiny-t5 in bfloat16), row by row",
             "columns": ["quantity", "kind", "CPU", "H200", "CPU vs H200"], "rows": rows}
    by_kind = {k: [r for r in rows if r[1] == k] for k in (cat, mag)}
    cat_diff = [r for r in by_kind[cat] if r[4] == DIFFERS]
    mag_diff = [r for r in by_kind[mag] if r[4] == DIFFERS]
    short = {"caption": "Where the CPU and the H200 runs differ (every other row of the full comparison is the same)",
             "columns": ["quantity", "kind", "CPU", "H200"], "rows": [r[:4] for r in cat_diff + mag_diff]}
    q = {
        "categorical_rows": {"value": len(by_kind[cat]), "display": f"{len(by_kind[cat])}",
                             "statistic": "categorical outcomes compared"},
        "categorical_verdict": {
            "value": len(cat_diff),
            "display": ("all the same" if not cat_diff else f"the same except {len(cat_diff)}"),
            "statistic": "categorical outcomes that differ between the CPU and the H200 run"},
        "magnitude_rows": {"value": len(by_kind[mag]), "display": f"{len(by_kind[mag])}",
                           "statistic": "float magnitudes compared"},
        "magnitude_verdict": {"value": len(mag_diff), "display": f"{len(mag_diff)} of {len(by_kind[mag])}",
                              "statistic": "float magnitudes whose displayed value differs between the two runs"},
    }
    return {"name": "cpu_vs_gpu", "command": "tools/render_results.py", "quantities": q,
            "tables": {"full": table, "differences": short},
            "_source": "`results/scale_wipe.json` and `results/cross_stride.json` next to `results/gpu/scale_wipe_cuda.json` "
                       "and `results/gpu/cross.log`, compared by `tools/render_results.py`"}


# ---- the GPU benchmark (notebook 05's CSV) -----------------------------------------------------------------------

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


def _key(text: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_")


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
        tag = f"{_key(f)}_b{b}_c{c}"
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
            q[f"block_over_row_{_key(f[:-6])}"] = {
                "value": [min(gains), max(gains)], "display": f"{min(gains):.2f}-{max(gains):.2f}x",
                "statistic": f"{f[:-6]}: row-placement time / block-placement time, every shape with batch >= 16 "
                             "and context >= 4096"}
    prefill = {r["format"]: r for r in rows if r["kind"] == "prefill"}
    sdpa = prefill.get("self causal, torch SDPA")
    for name, r in prefill.items():
        if sdpa and r is not sdpa:
            x = r["TFLOPs"] / sdpa["TFLOPs"]
            q[f"prefill_x_sdpa_{_key(name.split(', ', 1)[-1])}"] = {
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

    def engine_base(r):
        return next((x["tokens_per_s"] for x in engine if x["format"] == "auto" and (x["batch"], x["context"],
                                                                                     x["mode"]) ==
                     (r["batch"], r["context"], r["mode"])), None)
    if engine:
        order = {"replayed": 0, "eager": 1}
        listed = sorted(engine, key=lambda r: (-r["batch"], r["context"], order.get(r["mode"], 2)))
        tables["engine"] = {
            "caption": "The engine: decode tokens/s per format, context and mode (`python -m minikv.bench attention "
                       "--engine`, the engine-decode rows of the CSV; replayed: CUDA graphs, eager: "
                       "enforce_eager=True, sdpa-graph: the same model's step with torch SDPA over a contiguous "
                       "bf16 cache, captured; vs bf16: against bf16 at the same batch, context and mode)",
            "columns": ["kv_cache_dtype", "batch", "context", "mode", "ms / step", "tokens/s", "vs bf16",
                        "prefill tokens/s"],
            "rows": [[r["format"], int(r["batch"]), int(r["context"]), r["mode"], f"{r['ms']:.2f}",
                      f"{r['tokens_per_s']:,.0f}", _ratio(r["tokens_per_s"] / engine_base(r)) if engine_base(r)
                      else "–", f"{r['prefill_tokens_per_s']:,.0f}" if isinstance(r.get("prefill_tokens_per_s"),
                                                                                 float) else "–"]
                     for r in listed]}
        main = engine[0]        # the engine bench measures its main batch and context first
        for r in engine:
            if (r["batch"], r["context"], r["mode"]) == (main["batch"], main["context"], main["mode"]):
                x = r["tokens_per_s"] / engine_base(r)
                q[f"engine_x_bf16_{_key(r['format'])}"] = {
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
        "caption": "The performance targets, each a ratio within this one run (ratios rounded down to three decimals, "
                   "as `minikv.bench.attention.format_ratio` prints them)",
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
            q[f"step_x_bf16_{_key(r['format'])}"] = {"value": x, "display": _ratio(x),
                                                      "statistic": f"decode-step tokens/s of {r['format']} / bf16's"}
    return {"name": "gpu", "command": "python -m minikv.bench attention --engine --peer flashinfer --csv "
                                      "notebooks/data/gpu_attention.csv",
            "quantities": q, "tables": tables,
            "_source": "`notebooks/data/gpu_attention.csv` (one run of `bash tools/gpu.sh bench` on an H200: "
                       "`python -m minikv.bench attention --engine --peer flashinfer`) and `gpu_decode_step.csv` "
                       "(`python -m minikv.bench.decode_step`, an earlier run)"}


# ---- the shipped models -------------------------------------------------------------------------------------------

MODEL_TASKS = {"tiny-gemma4": "continue any window of an arithmetic sequence, 12 new tokens",
               "tiny-t5": "the distinct characters of a string, sorted"}
FORMATS = ("auto", "int8_per_token_head", "fp8_per_token_head", "fp8")


def _pct(correct: int, n: int) -> str:
    return f"{100 * correct / n:.1f}%"


def load_models(repo: Path) -> dict | None:
    weights = repo / "minikv" / "models" / "weights"
    paths = sorted(weights.glob("*/training.json"))
    if not paths:
        return None
    q, rows = {}, []
    for path in paths:
        model = path.parent.name
        data = _read_json(path)
        ev, tr = data.get("evaluation", {}), data.get("training", {})
        sets = [("held-out", ev)] + ([("small numbers", ev["small_numbers"])] if "small_numbers" in ev else [])
        for label, block in sets:
            n, correct = block["n"], block["correct"]
            what = f"held-out prompts ({MODEL_TASKS.get(model, model)})" if label == "held-out" \
                else "small-number prompts"
            rows.append([f"{model}: {n:,} {what}",
                         *[_pct(correct[f], n) if f in correct else "–" for f in FORMATS]])
            for f in FORMATS:
                if f in correct:
                    tag = f"{_key(model)}_{_key(label)}_{f}"
                    q[tag] = {"value": correct[f], "display": f"{correct[f]:,} of {n:,}",
                              "statistic": f"{model}: greedy exact match, {label} prompts, {f}; {block.get('what', '')}"}
                    q[f"{tag}_pct"] = {"value": correct[f] / n, "display": _pct(correct[f], n),
                                       "statistic": f"the same as a share of {n:,}"}
        if "train_wall_s" in tr:
            q[f"{_key(model)}_train_minutes"] = {
                "value": tr["train_wall_s"] / 60, "display": f"{tr['train_wall_s'] / 60:.0f} minutes",
                "statistic": f"{model}: training wall time ({tr.get('note', '')})"}
    table = {"caption": "Greedy exact match of the shipped models (dense decoding in float32, K/V fake-quantized as "
                        "each kv_cache_dtype stores them), from each model's training.json",
             "columns": ["model and prompts", *[f"`{f}`" for f in FORMATS]], "rows": rows}
    return {"name": "models", "command": "minikv train MODEL", "quantities": q, "tables": {"quality": table},
            "_source": "`minikv/models/weights/*/training.json`, written by `minikv train MODEL`"}


# ---- the engine on the CPU ---------------------------------------------------------------------------------------

CPU_BENCH = Path("results/cpu/bench_engine.log")
_BENCH_LINE = re.compile(r"^\s*(?P<backend>triton|torch)\s+(?P<wall>[\d.]+) s \((?P<cpu>[\d.]+) s CPU\)\s+"
                         r"(?P<tps>[\d.]+) tokens/s\s+\((?P<right>\d+)/(?P<n>\d+) right\)")


def load_cpu_speed(repo: Path) -> dict | None:
    path = repo / CPU_BENCH
    if not path.exists():
        return None
    text = path.read_text()
    q = {}
    for line in text.splitlines():
        m = _BENCH_LINE.match(line)
        if m:
            b = m.group("backend")
            q[f"{b}_wall"] = {"value": float(m.group("wall")), "display": f"{float(m.group('wall')):.1f} s",
                              "statistic": f"wall time, {b} backend"}
            q[f"{b}_cpu"] = {"value": float(m.group("cpu")), "display": f"{float(m.group('cpu')):.1f} s",
                             "statistic": f"process CPU time, {b} backend"}
            q[f"{b}_right"] = {"value": int(m.group("right")), "display": f"{m.group('right')}/{m.group('n')}",
                               "statistic": f"answers right, {b} backend"}
    if {"triton_cpu", "torch_cpu"} <= set(q):
        x = q["triton_cpu"]["value"] / q["torch_cpu"]["value"]
        q["triton_over_torch_cpu"] = {"value": x, "display": f"{x:.0f}",
                                      "statistic": "triton / torch process CPU time"}
    if not q:
        raise ResultsError(f"{path}: no `python -m minikv.bench engine` result lines found")
    return _log_source("cpu_speed", "python -m minikv.bench engine", text, q, r"load average:",
                       "the machine's 1-minute load average right after the run",
                       "`results/cpu/bench_engine.log`, printed by `python -m minikv.bench engine`")


def _log_source(name: str, command: str, text: str, q: dict, load_label: str, load_statistic: str,
                source: str) -> dict:
    """A source read from a command's log: its quantities, the machine's load average where the log names it, and
    the log's first line after the command as its header."""
    load = re.search(load_label + r" ([\d.]+)", text)
    if load:
        q["load_average"] = {"value": float(load.group(1)), "display": load.group(1), "statistic": load_statistic}
    header = text.splitlines()[1] if text.startswith("$") else text.splitlines()[0]
    return {"name": name, "command": command, "quantities": q, "tables": {}, "header": header, "_source": source}


CI_RUN = Path("results/cpu/ci_run.log")
_PYTEST_SUMMARY = re.compile(r"^(?P<counts>(?:\d+ \w+(?:, )?)+) in (?P<s>[\d.]+)s\b", re.MULTILINE)
_ELAPSED = re.compile(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)")


def _minutes(seconds: float, statistic: str) -> dict:
    return {"value": seconds, "display": f"{seconds / 60:.1f} minutes", "statistic": statistic}


def load_test_time(repo: Path) -> dict | None:
    """CI's job from a fresh clone: the whole wall time, and the pytest suite's and both nbval passes' own times."""
    path = repo / CI_RUN
    if not path.exists():
        return None
    text = path.read_text()
    runs = list(_PYTEST_SUMMARY.finditer(text))
    elapsed = _ELAPSED.search(text)
    status = re.search(r"^exit status (\d+)", text, re.MULTILINE)
    if len(runs) != 3 or not elapsed or not status:
        raise ResultsError(f"{path}: expected three pytest summaries (the suite, two nbval passes), /usr/bin/time's "
                           f"elapsed line and the exit status; found {len(runs)} summaries")
    if status.group(1) != "0":
        raise ResultsError(f"{path}: the timed run failed (exit status {status.group(1)}); time a passing run")
    h, m, sec = elapsed.groups()
    wall = int(h or 0) * 3600 + int(m) * 60 + float(sec)
    suite, first, second = (float(r.group("s")) for r in runs)
    q = {"wall": _minutes(wall, "wall time of `bash .ci/run` in a fresh clone, setup included"),
         "pytest": _minutes(suite, "the pytest suite's own time (two workers)"),
         "nbval_first": _minutes(first, "nbval, first float environment"),
         "nbval_second": _minutes(second, "nbval, second float environment"),
         "setup": _minutes(wall - suite - first - second, "the rest: clone's .venv, installs, pytest start-up"),
         "pytest_counts": {"value": runs[0].group("counts"), "display": runs[0].group("counts"),
                           "statistic": "the pytest suite's outcome counts"}}
    return _log_source("test_time", "bash tools/time_fresh_clone.sh", text, q, r"load average before:",
                       "the machine's 1-minute load average when the run started",
                       "`results/cpu/ci_run.log`, written by `bash tools/time_fresh_clone.sh`")


MAKE_RUN = Path("results/cpu/make_run.log")
_SECONDS = {"user": re.compile(r"User time \(seconds\): ([\d.]+)"), "system": re.compile(r"System time \(seconds\): ([\d.]+)")}


def load_make_run(repo: Path) -> dict | None:
    """`make run` (the demo) timed once with /usr/bin/time -v: its wall and CPU time, the load before and after."""
    path = repo / MAKE_RUN
    if not path.exists():
        return None
    text = path.read_text()
    elapsed = _ELAPSED.search(text)
    status = re.search(r"^exit status (\d+)", text, re.MULTILINE)
    cpu = [p.search(text) for p in _SECONDS.values()]
    if not elapsed or not status or not all(cpu):
        raise ResultsError(f"{path}: expected /usr/bin/time -v's elapsed, user and system lines and the exit status")
    if status.group(1) != "0":
        raise ResultsError(f"{path}: the timed run failed (exit status {status.group(1)}); time a passing run")
    h, m, sec = elapsed.groups()
    wall = int(h or 0) * 3600 + int(m) * 60 + float(sec)
    busy = sum(float(c.group(1)) for c in cpu)
    q = {"wall": {"value": wall, "display": f"{wall:.0f} s", "statistic": "wall time of `make run`"},
         "cpu": {"value": busy, "display": f"{busy:.0f} s", "statistic": "user + system CPU time of `make run`"}}
    after = re.search(r"load average after: ([\d.]+)", text)
    if after:
        q["load_after"] = {"value": float(after.group(1)), "display": after.group(1),
                           "statistic": "the machine's 1-minute load average when the run ended"}
    return _log_source("make_run", "/usr/bin/time -v make run", text, q, r"load average before:",
                       "the machine's 1-minute load average when the run started",
                       "`results/cpu/make_run.log`, `make run` under `/usr/bin/time -v`")


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


# ---- rendering ---------------------------------------------------------------------------------------------------

def known_names(results: dict[str, dict]) -> list[str]:
    return [f"{stem}.{kind}.{key}" for stem, data in results.items()
            for kind in ("quantities", "tables") for key in data[kind]]


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return format(value, "g")
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_table(data: dict, key: str) -> str:
    """The Markdown of one table: caption, table (numeric columns right-aligned), the command it came from."""
    table = data["tables"][key]
    numeric = [all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in table["rows"])
               and bool(table["rows"]) for i in range(len(table["columns"]))]
    lines = []
    if table.get("caption"):
        lines += [table["caption"], ""]
    lines.append("| " + " | ".join(_cell(c) for c in table["columns"]) + " |")
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
    source = data.get("_source") or f"`results/{data['name']}.json`, written by `{data['command']}`"
    lines += ["", f"({source})"]
    return "\n".join(lines)


def render_value(results: dict[str, dict], name: str) -> str:
    """What goes between the markers of block `name` (a table with blank lines around it, or a display string)."""
    parts = name.split(".")
    if len(parts) != 3 or parts[1] not in ("quantities", "tables"):
        raise ResultsError(f"bad results name {name!r}: write STEM.quantities.KEY or STEM.tables.KEY")
    stem, kind, key = parts
    if stem not in results or key not in results[stem][kind]:
        raise ResultsError(f"unknown results name {name!r}")
    if kind == "quantities":
        return results[stem]["quantities"][key]["display"]
    return "\n" + render_table(results[stem], key) + "\n"


def render_text(text: str, results: dict[str, dict], where: str = "<text>") -> str:
    """`text` with every results block filled in; ResultsError (with file and line) for a name not defined, an
    inline block at the start of a line, or a table block that does not stand on lines of its own."""
    def fill(match: re.Match) -> str:
        name = match.group("name")
        line = text.count("\n", 0, match.start()) + 1
        try:
            value = render_value(results, name)
        except ResultsError as e:
            names = ", ".join(known_names(results)) or "none (results/ holds no *.json: run `make results`)"
            raise ResultsError(f"{where}:{line}: {e}; known names: {names}") from None
        before = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
        after_end = text.find("\n", match.end())
        after = text[match.end():after_end if after_end >= 0 else len(text)]
        if name.split(".")[1] == "quantities" and not before.strip():
            raise ResultsError(f"{where}:{line}: the inline block {name!r} starts a line; Markdown reads a line "
                               "that starts with an HTML comment as an HTML block and splits the paragraph there. "
                               "Rewrap the paragraph so that a word comes first on the line")
        if name.split(".")[1] == "tables" and (before.strip() or after.strip()):
            raise ResultsError(f"{where}:{line}: the table block {name!r} must stand on lines of its own")
        return f"<!-- results:{name} -->{value}<!-- /results -->"

    return BLOCK.sub(fill, text)


def target_files(repo: Path) -> list[Path]:
    return [p for p in [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))] if p.exists()]


def render_repo(repo: Path = REPO, write: bool = True) -> list[Path]:
    """Render README.md and docs/**/*.md from the repo's results sources; return the files whose text changed (or
    would)."""
    results = load_sources(repo)
    changed = []
    for path in target_files(repo):
        text = path.read_text()
        new = render_text(text, results, str(path.relative_to(repo)))
        if new != text:
            changed.append(path)
            if write:
                path.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is out of date")
    p.add_argument("--list", action="store_true", help="print the names the results sources define")
    p.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        if args.list:
            results = load_sources(args.repo)
            for name in known_names(results):
                stem, kind, key = name.split(".")
                shown = results[stem][kind][key]["display"] if kind == "quantities" else "(table)"
                print(f"{name}  {shown}")
            return 0
        changed = render_repo(args.repo, write=not args.check)
    except ResultsError as e:
        print(f"render_results: {e}", file=sys.stderr)
        return 2
    rel = [str(c.relative_to(args.repo)) for c in changed]
    if args.check:
        if rel:
            print("out of date with the results sources: " + ", ".join(rel) + " (run `python tools/render_results.py`)")
            return 1
        print("README.md and docs are in sync with the results sources")
        return 0
    print(f"rendered results into {len(rel)} file(s)" + (": " + ", ".join(rel) if rel else " (all in sync)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
