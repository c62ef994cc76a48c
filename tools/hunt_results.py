"""Measure `minikv hunt` and write results/hunt.json (the figures README, docs/hunt.md and notebook 06 quote).

    python tools/hunt_results.py --results results/hunt.json [--budget 120]

This is the experimenter, not the hunter: it knows the defect registry and hands each name to `minikv hunt`, which
does not. Measured:
- the fixed engine: `minikv hunt --budget B` (clean; how many scenarios fit in the budget);
- each defect: `minikv hunt --reintroduce NAME --budget B`, as a separate process (wall time including start-up
  and shrinking), and the same hunt in-process for its details (invariant, scenarios before the finding, seconds
  to it, shrink runs);
- the checks upstream's test matrices lacked, each alone: the first-versus-later batch comparison on the scale wipe,
  the dense-reference comparison alone on the cross stride;
- the near-tie calibration: the smallest margin by which the dense model picks any reference token of the prompt
  pool (every format, both dtypes), and the largest logit difference between its float16 and float32 runs.
Times are taken on whatever machine runs this (the CPU, its load average and the backend are recorded).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _cli(args: list[str]) -> tuple[int, float, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "minikv", "hunt", *args], capture_output=True, text=True,
                          env=env, cwd=os.environ.get("TMPDIR", "/tmp"), check=False)
    return done.returncode, time.monotonic() - start, done.stdout


def _calibration() -> tuple[float, float]:
    from minikv.hunt.reference import DenseReference
    from minikv.hunt.strategies import cells, prompt_pool
    ref, margin, gap = DenseReference(), float("inf"), 0.0
    for model, fmt, _ in cells(dtypes=("float16",)):
        for prompt in prompt_pool(model):
            half, full = ref.get(model, fmt, "float16", prompt), ref.get(model, fmt, "float32", prompt)
            for row, token in zip(half.logits, half.token_ids):
                margin = min(margin, float(row[token] - row.topk(2).values[1]))
            for a, b, ta, tb in zip(half.logits, full.logits, half.token_ids, full.token_ids):
                gap = max(gap, float((a - b).abs().max()))
                if ta != tb:
                    break
    return margin, gap


def measure(budget: float) -> dict:
    import minikv
    from minikv.hunt import hunt
    load = os.getloadavg()[0]
    rc, fixed_wall, out = _cli(["--budget", str(budget)])
    if rc != 0:
        raise SystemExit(f"the fixed engine did not come out clean (exit {rc}):\n{out}")
    fixed_scenarios = int(out.split()[1])
    rows, quantities = [], {}
    for name in minikv.bugs.DEFECTS:
        rc, wall, out = _cli(["--reintroduce", name, "--budget", str(budget)])
        if rc != 1:
            raise SystemExit(f"{name} was not found (exit {rc}):\n{out}")
        report = hunt(reintroduce=(name,), budget_s=budget, progress=False)
        f = report.finding
        invariants = ", ".join(dict.fromkeys(v.oracle for v in f.violations))
        rows.append([name, invariants, " x ".join(f.cell), str(f.scenarios_before + 1), f"{f.seconds_to_find:.1f} s",
                     str(f.shrink_runs), f"{wall:.0f} s"])
        quantities[f"{name.replace('-', '_')}_wall"] = {
            "value": round(wall, 1), "display": f"{wall:.0f} s",
            "statistic": f"wall time of `minikv hunt --reintroduce {name} --budget {budget:g}` as a separate process "
                         f"(start-up, search and shrinking), torch backend"}
    checks = []
    for title, name, oracle in (("first batch vs a later one (vLLM)", "scale-wipe", "repeat-identical"),
                                ("dense reference alone, pools down to the need (TensorRT-LLM's golden)",
                                 "cross-stride", "matches-reference")):
        report = hunt(reintroduce=(name,), oracles=(oracle,), budget_s=budget, progress=False)
        f = report.finding
        checks.append([title, name, oracle, "found" if f else "not found",
                       str(f.scenarios_before + 1) if f else "–", f"{f.seconds_to_find:.1f} s" if f else "–"])
    margin, gap = _calibration()
    quantities.update({
        "fixed_scenarios": {"value": fixed_scenarios, "display": f"{fixed_scenarios} scenarios",
                            "statistic": f"scenarios `minikv hunt --budget {budget:g}` ran on the fixed engine, all "
                                         f"clean"},
        "budget": {"value": budget, "display": f"{budget:g} s", "statistic": "the --budget of every hunt measured here"},
        "load_average": {"value": round(load, 1), "display": f"load average {load:.1f}",
                         "statistic": f"1-minute load average of the {os.cpu_count()}-core machine when the "
                                      f"measurement started (shared with other sessions)"},
        "tie_min_margin": {"value": round(margin, 2), "display": f"{margin:.1f} logits",
                           "statistic": "smallest margin by which the dense model picks a reference token, over the "
                                        "prompt pool, every KV format, float16 and float32"},
        "f16_f32_gap": {"value": round(gap, 2), "display": f"{gap:.1f} logits",
                        "statistic": "largest logit difference between the dense model's float16 and float32 runs "
                                     "of the same reference (same tokens so far), same pool and formats"},
    })
    return {
        "name": "hunt",
        "command": f"python tools/hunt_results.py --results results/hunt.json --budget {budget:g}",
        "model": "tiny-gemma4, tiny-t5",
        "notebook": "notebooks/06_catching_defects.ipynb",
        "quantities": quantities,
        "tables": {
            "defects": {"caption": f"Each historical defect found blind by `minikv hunt` (torch backend, budget "
                                   f"{budget:g} s, seed 0; {os.cpu_count()}-core CPU at load average {load:.1f})",
                        "columns": ["defect", "invariant", "cell", "scenario", "to the finding", "shrink runs",
                                    "`minikv hunt` wall time"],
                        "rows": rows},
            "upstream_checks": {"caption": "The check each upstream test matrix lacked, run alone",
                                "columns": ["check", "defect", "invariant", "outcome", "scenario", "to the finding"],
                                "rows": checks},
        },
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=REPO / "results" / "hunt.json")
    p.add_argument("--budget", type=float, default=120.0)
    args = p.parse_args(argv)
    data = measure(args.budget)
    args.results.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
