"""Provenance: every upstream PR or issue number the project cites is one the upstream texts give.

The texts (shared/upstream/*.md, outside the repository) give: TensorRT-LLM PR #20958 closing issue #19861 (and
#17558, which moved the file the fallback lives in); vLLM issues #50702 and #50749, and #48842 (unrelated). The
vLLM pull request's own number is not given, so no number may be cited for it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from minikv import bugs

REPO = Path(__file__).resolve().parents[1]
GIVEN = {"20958", "19861", "17558", "50702", "50749", "48842"}
CITE = re.compile(r"(?:\bPR\s*#?|\bissues?\s*#?|\bpull request\s*#?|(?<![\w#])#)(\d{4,6})\b")
PROSE = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "notebooks").glob("*.py"),
                REPO / "minikv" / "bugs.py"])


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(REPO)))
def test_only_numbers_the_upstream_texts_give_are_cited(path):
    cited = {m.group(1) for m in CITE.finditer(path.read_text())}
    assert cited <= GIVEN, f"{path.name} cites {sorted(cited - GIVEN)}, which the upstream texts do not give"


def test_registry_references():
    assert "#20958" in bugs.DEFECTS["cross-stride"].upstream_reference
    assert "#19861" in bugs.DEFECTS["cross-fp8-context-read"].upstream_reference
    ref = bugs.DEFECTS["scale-wipe"].upstream_reference
    assert "#50702" in ref and "#50749" in ref and "not given" in ref
