"""nbval, with the project's real sanitize file, still fails when a recorded result changes.

The sanitize file hides what truly varies between runs (addresses, timings, temporary paths, figure sizes). This
test makes sure it hides nothing more: it copies the first cells of notebook 01 (the engine serving 16 requests,
with their token ids and the "all answers right" outcome) into a temporary notebook, adds one cell whose recorded
address and duration differ from any fresh run, and runs nbval on three copies in one subprocess:

* the copy as recorded passes, so the sanitize file is applied and the cells are portable;
* a copy with one recorded token id changed fails, in that cell only;
* a copy with the categorical outcome flipped (True -> False) fails, in that cell only.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[notebooks]')")
pytest.importorskip("nbval", reason="nbval is not installed (pip install -e '.[notebooks]')")

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "notebooks" / "01_paged_kv_cache.ipynb"
SANITIZE_FILE = REPO / "notebooks" / "nbval_sanitize.cfg"
LAST_CELL_MARK = "all answers right: "           # the copy ends with the cell that serves the requests
TOKENS_MARK = "tokens in the cache at the end: ["


def _stdout(cell) -> str:
    return "".join(o["text"] for o in cell.outputs if o.get("output_type") == "stream" and o["name"] == "stdout")


def _set_stdout(cell, old: str, new: str) -> None:
    hits = [o for o in cell.outputs if o.get("output_type") == "stream" and old in o["text"]]
    assert len(hits) == 1, f"{old!r} not recorded exactly once"
    hits[0]["text"] = hits[0]["text"].replace(old, new, 1)


def _short_copy():
    """Notebook 01's code cells up to the engine run, plus one cell of run-to-run noise the sanitize file masks."""
    nb = nbformat.read(SOURCE, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        cells.append(cell)
        if LAST_CELL_MARK in _stdout(cell):
            break
    else:
        pytest.fail(f"{SOURCE.name} no longer records {LAST_CELL_MARK!r}: update this test's cell selection")
    noise = nbformat.v4.new_code_cell("import time\nt0 = time.perf_counter()\nprint(object())\n"
                                      "print(f'took {time.perf_counter() - t0 + 1:.3f} s')")
    noise.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                            text="<object object at 0x7f00deadbeef>\ntook 99.999 s\n")]
    noise.execution_count = cells[-1].execution_count + 1      # nbval treats a cell without a count as unrun
    nb.cells = cells + [noise]
    return nb, len(cells) - 1


def test_nbval_fails_on_a_changed_result_and_passes_the_recorded_one(tmp_path):
    nb, engine_cell = _short_copy()
    recorded = _stdout(nb.cells[engine_cell])
    first_token = int(recorded.split(TOKENS_MARK)[1].split(",")[0])

    nbformat.write(nb, tmp_path / "as_recorded.ipynb")
    _set_stdout(nb.cells[engine_cell], f"{TOKENS_MARK}{first_token},", f"{TOKENS_MARK}{first_token + 1},")
    nbformat.write(nb, tmp_path / "token_changed.ipynb")
    _set_stdout(nb.cells[engine_cell], f"{TOKENS_MARK}{first_token + 1},", f"{TOKENS_MARK}{first_token},")
    _set_stdout(nb.cells[engine_cell], f"{LAST_CELL_MARK}True", f"{LAST_CELL_MARK}False")
    nbformat.write(nb, tmp_path / "outcome_flipped.ipynb")

    env = dict(os.environ, TQDM_DISABLE="1", OMP_NUM_THREADS="1")
    env.pop("MPLBACKEND", None)              # as in `make test`: the kernel picks its own backend
    names = ["as_recorded.ipynb", "token_changed.ipynb", "outcome_flipped.ipynb"]
    (tmp_path / "pytest.ini").write_text("[pytest]\n")      # rootdir here, none of the repo's pytest options
    run = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--nbval",
                          "--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE_FILE), *names],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    # nbval's item ids do not name the notebook reliably, so read the per-cell outcomes in run order: the notebooks
    # in the order given, each cell by cell.
    outcomes = re.findall(r"::Cell (\d+) (PASSED|FAILED)", run.stdout)
    n = len(nb.cells)
    assert [int(c) for c, _ in outcomes] == list(range(n)) * len(names), run.stdout[-3000:]
    failed = {name: [i for i, (_, o) in enumerate(outcomes[k * n:(k + 1) * n]) if o == "FAILED"]
              for k, name in enumerate(names)}
    assert failed == {"as_recorded.ipynb": [], "token_changed.ipynb": [engine_cell],
                      "outcome_flipped.ipynb": [engine_cell]}, run.stdout[-3000:]
