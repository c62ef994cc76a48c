"""Re-execute the cells of a GPU-recorded notebook that need no GPU, keeping the `# NBVAL_SKIP` cells' outputs.

Notebook 05 is recorded on a GPU. Its plots and tables read only the committed CSV, so they can be (re)drawn on any
machine: this runs every other cell in order in one kernel and renumbers the code cells 1..N.

    python tools/record_cpu_cells.py notebooks/05_gpu_performance.ipynb
"""
import sys

import nbclient
import nbformat


def main(path: str) -> None:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=600,
                                     resources={"metadata": {"path": str(__import__("pathlib").Path(path).parent)}})
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


if __name__ == "__main__":
    main(sys.argv[1])
