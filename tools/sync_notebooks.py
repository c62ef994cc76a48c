"""Pair and sync every notebook in notebooks/: `NAME.py` (jupytext percent) <-> `NAME.ipynb` (recorded outputs).

    python tools/sync_notebooks.py [notebooks-dir]
    python tools/sync_notebooks.py --cpu-cells notebooks/05_gpu_performance.ipynb

`--cpu-cells NB` re-executes the cells of a GPU-recorded notebook that need no GPU, in order in one kernel, and
keeps the outputs of its `# NBVAL_SKIP` (GPU) cells; code cells are renumbered 1..N. Notebook 05's plots and tables
read only its committed CSV, so they can be redrawn on any machine.

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


def record_cpu_cells(path: str) -> None:
    """Re-execute every code cell of `path` that does not start with `# NBVAL_SKIP`, keeping the others' outputs."""
    import nbclient
    import nbformat
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                                     resources={"metadata": {"path": str(Path(path).parent)}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and not cell.source.lstrip().startswith("# NBVAL_SKIP"):
                client.execute_cell(cell, index)
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if out.get("output_type") == "execute_result":
                    out["execution_count"] = count
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--cpu-cells"]:
        if len(argv) != 2:
            print("usage: python tools/sync_notebooks.py --cpu-cells NOTEBOOK.ipynb", file=sys.stderr)
            return 2
        record_cpu_cells(argv[1])
        print(f"re-executed the CPU cells of {argv[1]}")
        return 0
    notebooks_dir = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "notebooks"
    if not notebooks_dir.is_dir():
        print(f"no such folder: {notebooks_dir}", file=sys.stderr)
        return 2
    stems = sync(notebooks_dir)
    print(f"synced {len(stems)} notebook(s): {', '.join(stems) or '(none)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
