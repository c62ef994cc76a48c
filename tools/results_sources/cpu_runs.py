"""Results sources read from the CPU's own runs: the shipped models' evaluations (their training.json), the
engine benchmark's log, CI's job timed from a fresh clone, and `make run` timed once."""
from __future__ import annotations

import re
from pathlib import Path

from .schema import ResultsError, read_json, slug


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
        data = read_json(path)
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
                    tag = f"{slug(model)}_{slug(label)}_{f}"
                    q[tag] = {"value": correct[f], "display": f"{correct[f]:,} of {n:,}",
                              "statistic": f"{model}: greedy exact match, {label} prompts, {f}; {block.get('what', '')}"}
                    q[f"{tag}_pct"] = {"value": correct[f] / n, "display": _pct(correct[f], n),
                                       "statistic": f"the same as a share of {n:,}"}
        if "train_wall_s" in tr:
            q[f"{slug(model)}_train_minutes"] = {
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
