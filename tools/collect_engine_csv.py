"""notebooks/data/gpu_engine.csv from the CSVs of `minikv.bench engine --device cuda` runs kept under results/gpu/.

    python tools/collect_engine_csv.py RUN_DIR CSV [CSV ...]

Every row of each CSV (a path relative to RUN_DIR; a run kept in another folder is reached with ../), with two
columns added: `source` (that path: rows of one source come from one run, so ratios are taken within a source)
and `gpu` (RUN_DIR/gpu.txt's card name).
"""
import csv
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "notebooks" / "data" / "gpu_engine.csv"


def main(run_dir: str, names: list[str]) -> None:
    run = Path(run_dir)
    gpu = (run / "gpu.txt").read_text().splitlines()[1].split(",")[0].strip()
    rows = [r | {"source": name, "gpu": gpu} for name in names for r in csv.DictReader(open(run / name))]
    with open(OUT, "w", newline="") as f:
        writer = csv.DictWriter(f, list(dict.fromkeys(k for r in rows for k in r)))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {OUT}")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
