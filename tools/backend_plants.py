"""Seconds to find each planted defect in each adapter, and each clean adapter's hunt: results/backend_hunt.json.

`python tools/backend_plants.py --results results/backend_hunt.json` (CPU: flexattention, sdpa); on an H200:
`--adapters flashinfer --head-size 128 --results results/gpu/backend_hunt_flashinfer.json`. Per adapter: a clean
hunt over every family (`--budget` s, seed 0), then each plant until its first finding; kernels are warmed up first.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapters", nargs="+", default=["flexattention", "sdpa"])
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--head-size", type=int, default=None, help="hunt this head size only (fewer JIT compiles)")
    p.add_argument("--results", required=True)
    args = p.parse_args(argv)
    import torch

    from minikv.attention import backends
    from minikv.hunt.backend_hunt import hunt_backend, warm_up
    from minikv.hunt.plants import PLANTS, Planted
    torch.set_num_threads(1)
    plants, families, runs = [], {}, {}
    for name in args.adapters:
        backend = backends.get(name)
        if args.head_size:
            backend.features = dataclasses.replace(backend.features, head_sizes=(args.head_size,))
        bad = warm_up(backend)
        if bad:
            print(f"{name}: the warm-up cases fail: {bad[0].summary}")
            return 1
        clean = hunt_backend(backend, budget_s=args.budget)
        print(clean.text())
        runs[name] = clean.to_dict()
        families[name] = {f.name: (f"{f.outcome}, {f.scenarios} scenarios" if f.outcome != "skipped"
                                   else f"skipped: {f.why}") for f in clean.families}
        for plant in PLANTS:
            report = hunt_backend(Planted(backend, plant, name), budget_s=args.budget, stop_at_first=True)
            f = report.first_finding()
            runs[f"{name}+{plant}"] = report.to_dict()
            if f is None:
                print(f"{name} {plant}: NOT FOUND in {args.budget:g} s")
                plants.append([name, plant, "-", "-", "-", "not found", "-"])
                continue
            print(f"{name} {plant}: {f.name}, {f.violations[0].invariant}, scenario {f.scenario_number}, "
                  f"{f.seconds_to_find:.2f} s")
            plants.append([name, plant, f.name, f.violations[0].invariant, f.scenario_number,
                           f"{f.seconds_to_find:.1f} s", f.shrink_runs])
    where = f"{torch.cuda.get_device_name()}" if torch.cuda.is_available() else f"{os.cpu_count()}-core CPU"
    load = round(os.getloadavg()[0], 1)
    names = list(next(iter(families.values())))
    data = {"name": Path(args.results).stem, "command": "python " + shlex.join(["tools/backend_plants.py", *sys.argv[1:]]
                                                                              if argv is None else argv),
            "machine": {"device": where, "load_average": load},
            "notebook": "notebooks/06_catching_defects.ipynb",     # the hunter's notebook (tables only, here)
            "quantities": {},
            "tables": {
                "plants": {"caption": f"Each planted defect found by `minikv hunt --backend` (seed 0, first finding, "
                                      f"{where} at load average {load})",
                           "columns": ["adapter", "plant", "family", "invariant", "scenario", "to the finding",
                                       "shrink runs"], "rows": plants},
                "families": {"caption": f"Each clean adapter's hunt over every family ({args.budget:g} s budget, "
                                        f"seed 0, {where})",
                             "columns": ["family", *families], "rows": [[n, *(families[a][n] for a in families)]
                                                                      for n in names]}},
            "hunts": runs}
    Path(args.results).write_text(json.dumps(data, indent=2) + "\n")
    print(f"results written to {args.results}")
    return 0 if all(row[5] != "not found" for row in plants) else 1


if __name__ == "__main__":
    sys.exit(main())
