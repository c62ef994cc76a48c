"""The notebook harness: paired sources in step, outputs recorded, and the nbval sanitize file doing its job.

Every notebooks/NAME.ipynb must have a paired NAME.py (jupytext percent) with the same cells, and must have been
executed top to bottom with outputs recorded (execution counts 1..N, no error outputs); otherwise nbval would
compare nothing. The checker itself is tested on small notebooks made here, so it is exercised (and can fail)
even before the real notebooks exist.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="jupytext is not installed (pip install -e '.[dev]')")
nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[notebooks]')")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
SANITIZE_FILE = NOTEBOOK_DIR / "nbval_sanitize.cfg"
GPU_NOTEBOOK = NOTEBOOK_DIR / "05_gpu_performance.ipynb"


def _cells(path: Path) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in jupytext.read(path).cells]


def notebook_problems(ipynb: Path) -> list[str]:
    """Everything wrong with one recorded notebook and its pairing; empty when it is fine."""
    problems = []
    py = ipynb.with_suffix(".py")
    if not py.exists():
        problems.append(f"no paired {py.name} (run `make notebooks` or tools/sync_notebooks.py)")
    else:
        in_ipynb, in_py = _cells(ipynb), _cells(py)
        if len(in_ipynb) != len(in_py):
            problems.append(f"{ipynb.name} has {len(in_ipynb)} cells, {py.name} has {len(in_py)}: out of sync")
        else:
            for i, (a, b) in enumerate(zip(in_ipynb, in_py)):
                if a != b:
                    problems.append(f"cell {i} differs between {ipynb.name} and {py.name}: {a!r:.120} vs {b!r:.120}")
                    break
    notebook = nbformat.read(ipynb, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    counts = [c.execution_count for c in code]
    if counts != list(range(1, len(code) + 1)):
        problems.append(f"execution counts are {counts}, expected 1..{len(code)}: re-execute top to bottom")
    if code and not any(c.outputs for c in code):
        problems.append("no recorded outputs: nbval would compare nothing")
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    if errors:
        problems.append(f"recorded error output: {errors[0].ename}: {errors[0].evalue}")
    return problems


@pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks/*.ipynb yet")
@pytest.mark.parametrize("ipynb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_paired_and_recorded(ipynb):
    assert notebook_problems(ipynb) == []


@pytest.mark.skipif(not GPU_NOTEBOOK.exists(), reason="notebooks/05_gpu_performance.ipynb does not exist yet")
def test_gpu_notebook_skips_its_gpu_cells_under_nbval():
    sources = [c.source for c in nbformat.read(GPU_NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    assert any("# NBVAL_SKIP" in s for s in sources), (
        "05_gpu_performance is recorded on a GPU: mark its GPU cells with `# NBVAL_SKIP` so nbval on a CPU "
        "shows their recorded outputs without re-executing them")


# ---- the checker, on notebooks made here ---------------------------------------------------------------------

def _write_pair(folder: Path, executed: bool = True) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["jupytext"] = {"formats": "ipynb,py:percent"}
    notebook.cells = [nbformat.v4.new_markdown_cell("# A notebook"),
                      nbformat.v4.new_code_cell("import math"),
                      nbformat.v4.new_code_cell("print(math.pi)")]
    if executed:
        notebook.cells[1].execution_count = 1
        notebook.cells[2].execution_count = 2
        notebook.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="3.141592653589793\n")]
    ipynb = folder / "nb.ipynb"
    nbformat.write(notebook, ipynb)
    jupytext.write(notebook, folder / "nb.py", fmt="py:percent")
    return ipynb


def test_checker_accepts_a_recorded_pair(tmp_path):
    assert notebook_problems(_write_pair(tmp_path)) == []


def test_checker_rejects_a_stripped_notebook(tmp_path):
    problems = notebook_problems(_write_pair(tmp_path, executed=False))
    assert any("execution counts" in p for p in problems)
    assert any("no recorded outputs" in p for p in problems)


def test_checker_rejects_out_of_order_execution(tmp_path):
    ipynb = _write_pair(tmp_path)
    notebook = nbformat.read(ipynb, as_version=4)
    notebook.cells[1].execution_count, notebook.cells[2].execution_count = 3, 2
    nbformat.write(notebook, ipynb)
    assert any("execution counts are [3, 2]" in p for p in notebook_problems(ipynb))


def test_checker_rejects_a_py_out_of_step(tmp_path):
    ipynb = _write_pair(tmp_path)
    py = ipynb.with_suffix(".py")
    py.write_text(py.read_text().replace("print(math.pi)", "print(math.e)"))
    assert any("cell 2 differs" in p for p in notebook_problems(ipynb))
    py.unlink()
    assert any("no paired nb.py" in p for p in notebook_problems(ipynb))


def test_checker_rejects_a_recorded_error(tmp_path):
    ipynb = _write_pair(tmp_path)
    notebook = nbformat.read(ipynb, as_version=4)
    notebook.cells[2].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])]
    nbformat.write(notebook, ipynb)
    assert any("ValueError: bad" in p for p in notebook_problems(ipynb))


# ---- the sanitize file ---------------------------------------------------------------------------------------

def _sanitize(text: str) -> str:
    from nbval.plugin import get_sanitize_patterns  # the parser nbval itself uses

    for regex, replace in get_sanitize_patterns(SANITIZE_FILE.read_text(encoding="utf-8")):
        text = re.sub(regex, replace, text)
    return text


@pytest.mark.parametrize("first, second", [
    ("<minikv.engine.llm.LLM object at 0x7f3a2b9c1d90>", "<minikv.engine.llm.LLM object at 0x55d0e1a2b3c4>"),
    ("data_ptr=0x7f00aa001000", "data_ptr=0x7f00bb002000"),
    ("Wall time: 12.3 s", "Wall time: 9.87 s"),
    ("decode step took 4.2 ms", "decode step took 17 ms"),
    ("CPU times: user 1.2 s, sys: 300 us", "CPU times: user 2 s, sys: 41 us"),
    ("generate: 100%| 48/48 [00:03<00:00, 13.2it/s]", "generate: 100%| 48/48 [00:05<00:00, 9.1it/s]"),
    ("throughput 512.5 tok/s", "throughput 77 tok/s"),
    ("saved to /tmp/tmpa1b2c3/figure.png", "saved to /tmp/tmpzz9/figure.png"),
    ("<Figure size 640x480 with 1 Axes>", "<Figure size 800x300 with 1 Axes>"),
    ("decode reads 3100 GB/s", "decode reads 2875.5 GB/s"),
])
def test_sanitize_file_hides_run_to_run_noise(first, second):
    assert first != second
    assert _sanitize(first) == _sanitize(second)


@pytest.mark.parametrize("text", [
    "3 7 11 15 19 23 27",
    "damaged requests: [0, 1, 2, 3]",
    "K inflated x221, V x24",
    "kv_cache_dtype=int8_per_token_head max_num_seqs=4 block_size=16",
    "canary 0xA5 0x5A",
])
def test_sanitize_file_keeps_results(text):
    """Results that must be compared are left alone."""
    assert _sanitize(text) == text


def test_sanitize_file_keeps_the_axes_count():
    assert _sanitize("<Figure size 640x480 with 2 Axes>") != _sanitize("<Figure size 640x480 with 1 Axes>")
