"""notebooks/data/NAME.csv from two logs of `minikv.bench engine` (a decode change's A/B, the bench run without
--csv): per tree, format and context, the median step and the graph replay the bench printed (ms, two decimals),
the rows notebook 05's same_run_ab reads.

    python tools/engine_ab_csv.py NAME BEFORE_LOG BEFORE_LABEL AFTER_LOG AFTER_LABEL
"""
import csv
import re
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "notebooks" / "data"
ROW = re.compile(r"^\s+(\S+)\s+B=(\d+)\s+ctx=(\d+).*graph replay alone\s+([\d.]+) ms.*median ([\d.]+)")


def main(name: str, before: str, before_label: str, after: str, after_label: str) -> None:
    rows = [dict(tree=label, format=m[1], batch=m[2], context=m[3], step_ms=m[5], graph_replay_ms=m[4])
            for log, label in ((before, before_label), (after, after_label)) for m in map(ROW.match, open(log)) if m]
    out = DATA / f"{name}.csv"
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
