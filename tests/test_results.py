"""One number per quantity (issue 14 item 4): tools/render_results.py, and README/docs/notebooks against results/.

The renderer is tested on small results files made in tmp_path (table and inline blocks, an unknown name, a second
run changing nothing). Then the repository itself: README.md and docs/**/*.md must be what the renderer makes of
results/*.json, and every quantity's `display` string must appear in the recorded outputs of the notebook its
results file names. Those two skip only while results/ holds no *.json yet.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"

_spec = importlib.util.spec_from_file_location("render_results", REPO / "tools" / "render_results.py")
render_results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_results)


def _fixture(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "results").mkdir(parents=True)
    (repo / "docs" / "defects").mkdir(parents=True)
    (repo / "results" / "demo.json").write_text(json.dumps({
        "name": "demo", "command": "minikv repro demo --results results/demo.json", "model": "tiny",
        "notebook": "notebooks/99_demo.ipynb",
        "quantities": {"k_inflation": {"value": 41.2, "display": "x41", "statistic": "median of |K| ratios"}},
        "tables": {"damage": {"caption": "Damage per format.", "columns": ["format", "seqs", "damaged"],
                              "rows": [["int8", 4, "0-3"], ["fp8|x", 1056, "none"]]}},
    }))
    return repo


def test_inline_quantity_is_replaced_by_its_display(tmp_path):
    repo = _fixture(tmp_path)
    page = repo / "docs" / "defects" / "a.md"
    page.write_text("K grows <!-- results:demo.quantities.k_inflation -->x33.5<!-- /results --> here.\n")
    assert render_results.render_repo(repo) == [page]
    assert page.read_text() == "K grows <!-- results:demo.quantities.k_inflation -->x41<!-- /results --> here.\n"


def test_table_block_is_rendered_as_markdown(tmp_path):
    repo = _fixture(tmp_path)
    (repo / "README.md").write_text("# R\n\n<!-- results:demo.tables.damage -->\nold table\n<!-- /results -->\n\nend\n")
    render_results.render_repo(repo)
    assert (repo / "README.md").read_text() == (
        "# R\n\n<!-- results:demo.tables.damage -->\n"
        "Damage per format.\n\n"
        "| format | seqs | damaged |\n"
        "|---|---:|---|\n"
        "| int8 | 4 | 0-3 |\n"
        "| fp8\\|x | 1,056 | none |\n\n"
        "(`results/demo.json`, written by `minikv repro demo --results results/demo.json`)\n"
        "<!-- /results -->\n\nend\n")


def test_rendering_is_idempotent(tmp_path):
    repo = _fixture(tmp_path)
    page = repo / "docs" / "p.md"
    page.write_text("a <!-- results:demo.quantities.k_inflation --><!-- /results -->\n\n"
                    "<!-- results:demo.tables.damage --><!-- /results -->\n")
    assert render_results.render_repo(repo) == [page]
    once = page.read_text()
    assert render_results.render_repo(repo) == []
    assert page.read_text() == once
    assert render_results.main(["--repo", str(repo), "--check"]) == 0


def test_check_reports_a_stale_file_without_writing(tmp_path, capsys):
    repo = _fixture(tmp_path)
    page = repo / "docs" / "p.md"
    page.write_text("a <!-- results:demo.quantities.k_inflation -->x40<!-- /results -->\n")
    assert render_results.main(["--repo", str(repo), "--check"]) == 1
    assert "docs/p.md" in capsys.readouterr().out
    assert "x40" in page.read_text()


@pytest.mark.parametrize("name", ["demo.quantities.v_inflation", "demo.tables.nope", "other.tables.damage",
                                  "demo.k_inflation"])
def test_unknown_name_is_a_clear_error(tmp_path, name):
    repo = _fixture(tmp_path)
    (repo / "docs" / "p.md").write_text(f"line 1\nline 2 <!-- results:{name} -->?<!-- /results -->\n")
    with pytest.raises(render_results.ResultsError) as info:
        render_results.render_repo(repo)
    message = str(info.value)
    assert "docs/p.md:2" in message and name in message
    assert "demo.quantities.k_inflation" in message and "demo.tables.damage" in message   # what exists
    assert render_results.main(["--repo", str(repo)]) == 2


def test_malformed_results_file_is_a_clear_error(tmp_path):
    repo = _fixture(tmp_path)
    (repo / "results" / "bad.json").write_text(json.dumps({"name": "other", "command": "x", "quantities": {},
                                                            "tables": {}}))
    with pytest.raises(render_results.ResultsError, match="file stem is 'bad'"):
        render_results.render_repo(repo)


# ---- the repository -------------------------------------------------------------------------------------------

def _repo_results() -> dict[str, dict]:
    if not sorted(RESULTS.glob("*.json")):
        pytest.skip("results/ holds no *.json yet (`make results` writes them)")
    return render_results.load_results(RESULTS)


def test_readme_and_docs_are_in_sync_with_results():
    _repo_results()
    stale = render_results.render_repo(REPO, write=False)
    assert not stale, (f"{[str(p.relative_to(REPO)) for p in stale]} differ from results/*.json: run "
                       "`python tools/render_results.py` (or `make results` to measure again)")


def _recorded_text(notebook: Path) -> str:
    parts = []
    for cell in json.loads(notebook.read_text())["cells"]:
        for out in cell.get("outputs", []):
            text = out.get("text", "")
            parts.append("".join(text) if isinstance(text, list) else text)
            for mime in ("text/plain", "text/markdown", "text/html"):
                value = out.get("data", {}).get(mime, "")
                parts.append("".join(value) if isinstance(value, list) else value)
    return "\n".join(parts)


def test_every_quantity_is_printed_by_its_notebook():
    for stem, data in _repo_results().items():
        assert "notebook" in data, (f"results/{stem}.json has no \"notebook\" key: the repro must name the notebook "
                                    "that prints its quantities (CONTRIBUTING.md, \"Results files\")")
        notebook = REPO / data["notebook"]
        assert notebook.exists(), f"results/{stem}.json names {data['notebook']}, which does not exist"
        recorded = _recorded_text(notebook)
        missing = [f"{q} ({e['display']!r})" for q, e in data["quantities"].items() if e["display"] not in recorded]
        assert not missing, f"{data['notebook']} does not print these quantities of results/{stem}.json: {missing}"
