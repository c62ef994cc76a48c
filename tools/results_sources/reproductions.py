"""The reproductions' results: results/NAME.json (what `make results` writes on the CPU), the same reproductions on
an H200 (results/gpu/scale_wipe_cuda.json and results/gpu/cross.log, whose printed tables are parsed), and the two
side by side, row by row."""
from __future__ import annotations

import re
from pathlib import Path

from .schema import ResultsError, cell, check_shape, read_json


def load_results(results_dir: Path) -> dict[str, dict]:
    """Every results/NAME.json, checked for the schema's shape, keyed by NAME."""
    return {path.stem: check_shape(read_json(path), str(path), path.stem)
            for path in sorted(Path(results_dir).glob("*.json"))}


# ---- the reproductions on the GPU ------------------------------------------------------------------------------

def load_scale_wipe_cuda(repo: Path) -> dict | None:
    path = repo / "results" / "gpu" / "scale_wipe_cuda.json"
    if not path.exists():
        return None
    data = read_json(path)
    data = dict(data, name="scale_wipe_cuda",        # the repro's own results file, run on CUDA
                _source=f"`results/gpu/scale_wipe_cuda.json`, written by `{data.get('command', '?')}` on an H200")
    return check_shape(data, str(path), "scale_wipe_cuda")


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
            rows.append(_kind_row(f"{config}: {name}", kind, cell(ra[col[name]]), cell(rg[col[name]])))
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
