"""The notebooks' exercises make the learner think: none gives its answer away, and each is checked by nbval.

Every exercise is three tagged cells, in this order: `exercise` (the learner's cell: `my_answer_N = None`, a
hint that says what kind of answer is wanted), `check` (runs the engine and calls `minikv.exercises.check`, which
never prints the true answer; recorded with no answer filled in, so its output is the same on every machine)
and `solution` (folded in JupyterLab: source and output hidden; folded on the site by tools/docs_hooks.py; it
asserts the answer and prints it, below the fold, on a line starting "answer:"). Checked here: the structure, that
no hint and no question holds the printed answer, that the visible outputs hold no answer, that every solution
asserts and none is skipped by nbval; and `check` itself.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minikv.exercises import NO_ANSWER, check

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("0*.ipynb"))
WALKTHROUGH = ("01", "02", "03", "04", "05")        # the notebooks that must end with exercises


def _text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _output(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        text = out.get("text", "")
        parts.append("".join(text) if isinstance(text, list) else text)
        for value in out.get("data", {}).values():
            if isinstance(value, (str, list)):
                parts.append("".join(value) if isinstance(value, list) else value)
    return "\n".join(parts)


def _exercises(notebook: Path) -> list[dict]:
    """[{"question", "exercise", "check", "solution"}] in notebook order."""
    cells = json.loads(notebook.read_text())["cells"]
    found = []
    for i, cell in enumerate(cells):
        if "exercise" in cell.get("metadata", {}).get("tags", []):
            question = next(c for c in reversed(cells[:i]) if c["cell_type"] == "markdown")
            found.append({"question": question, "exercise": cell, "check": cells[i + 1], "solution": cells[i + 2]})
    return found


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_exercises_check_the_learner_without_giving_the_answer_away(notebook):
    exercises = _exercises(notebook)
    if notebook.stem[:2] in WALKTHROUGH:
        assert exercises, f"{notebook.name} has no exercise"
    elif not exercises:
        pytest.skip(f"{notebook.name} has no exercises (only the walkthrough's notebooks 01-05 must)")
    for n, ex in enumerate(exercises, 1):
        where = f"{notebook.name}, exercise {n}"
        learner, checker, solution = ex["exercise"], ex["check"], ex["solution"]
        variable = re.search(r"^(my_answer_\d+) = None\b.*#\s*(.+)$", _text(learner), re.MULTILINE)
        assert variable, f"{where}: the learner's cell must be `my_answer_N = None  # hint`"
        assert not learner.get("outputs"), f"{where}: the learner's cell prints something"
        assert "check" in checker["metadata"].get("tags", []), f"{where}: no check cell after the learner's"
        assert re.search(rf"check\([^)]*\b{variable.group(1)}\b", _text(checker)), (
            f"{where}: the check cell does not compare {variable.group(1)} with the engine's answer")
        assert NO_ANSWER in _output(checker), f"{where}: the check cell was not recorded with no answer filled in"
        tags, meta = solution["metadata"].get("tags", []), solution["metadata"].get("jupyter", {})
        assert "solution" in tags, f"{where}: no solution cell after the check"
        assert meta.get("source_hidden") and meta.get("outputs_hidden"), f"{where}: the solution is not folded"
        source = _text(solution)
        assert re.search(r"^\s*assert ", source, re.MULTILINE), f"{where}: the solution asserts nothing"
        assert "NBVAL_SKIP" not in source and "NBVAL_IGNORE" not in source, f"{where}: nbval skips the solution"
        printed = re.search(r"^answer: (.+)$", _output(solution), re.MULTILINE)
        assert printed, f"{where}: the solution's recorded output has no 'answer:' line"
        answer = re.split(r"[;(]| = | tokens", printed.group(1))[0].strip().rstrip(",")
        hint = variable.group(2)
        assert not re.search(rf"(?<![\w.]){re.escape(answer)}(?![\w.])", hint), (
            f"{where}: the hint {hint!r} holds the answer {answer!r}")
        if len(answer) >= 3:
            assert answer not in _text(ex["question"]), f"{where}: the question holds the answer {answer!r}"
            assert answer not in _output(checker), f"{where}: the check cell's output shows the answer {answer!r}"


def test_check_says_right_or_wrong_and_never_the_answer(capsys):
    assert check("Exercise 1", None, [4, 4]) is None
    assert NO_ANSWER in capsys.readouterr().out
    assert check("Exercise 1", (4, 4), [4, 4]) is True
    assert "right" in capsys.readouterr().out
    assert check("Exercise 1", [4, 5], [4, 4]) is False
    out = capsys.readouterr().out
    assert "not quite" in out and "[4, 5]" in out and "[4, 4]" not in out
    assert check("Exercise 2", 0.52, 0.515625, rel=0.01) is True
    assert check("Exercise 2", "0.5", 0.515625, abs_tol=0.001) is False
    assert check("Exercise 3", ["b", "a"], {"a", "b"}) is True
    assert check("Exercise 3", "nonsense", 3.0, abs_tol=0.5) is False
