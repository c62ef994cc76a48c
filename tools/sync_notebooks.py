"""Pair and sync every notebook in notebooks/: `NAME.py` (jupytext percent) <-> `NAME.ipynb` (recorded outputs).

    python tools/sync_notebooks.py [notebooks-dir]

A notebook that is not paired yet gets the pairing `ipynb,py:percent` (made from the .ipynb when there is one, so
its outputs are kept, else from the .py); a paired one is synced with `jupytext --sync`, which takes the inputs
from whichever file was edited last and keeps the outputs of the .ipynb. Used by `make notebooks`.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jupytext

PAIRING = "ipynb,py:percent"


def is_paired(path: Path) -> bool:
    formats = jupytext.read(path).metadata.get("jupytext", {}).get("formats", "")
    return "ipynb" in formats and "py" in formats


def sync(notebooks_dir: Path) -> list[str]:
    """Pair/sync each notebook; return the stems handled, in order."""
    stems = sorted({p.stem for p in notebooks_dir.glob("*.ipynb")} | {p.stem for p in notebooks_dir.glob("*.py")})
    for stem in stems:
        ipynb, py = notebooks_dir / f"{stem}.ipynb", notebooks_dir / f"{stem}.py"
        source = ipynb if ipynb.exists() else py
        if is_paired(source):
            args = ["--sync", str(source)]
        else:
            args = ["--set-formats", PAIRING, str(source)]
        subprocess.run([sys.executable, "-m", "jupytext", "--quiet", *args], check=True)
    return stems


def main(argv: list[str]) -> int:
    notebooks_dir = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "notebooks"
    if not notebooks_dir.is_dir():
        print(f"no such folder: {notebooks_dir}", file=sys.stderr)
        return 2
    stems = sync(notebooks_dir)
    print(f"synced {len(stems)} notebook(s): {', '.join(stems) or '(none)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
