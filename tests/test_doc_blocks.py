"""The Python blocks of README.md and docs/ run as tests (`make test`, through pytest-markdown-docs); this checks
that none is left out: no block is marked `notest`, a block that builds a CUDA engine names the `needs_cuda`
fixture (which skips it, with its reason, where there is no GPU), and every fixture a block names exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\S*[^\n]*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for match in FENCE.finditer(page.read_text()):
            info = match.group(1).strip().strip("{}").split()
            if info and info[0].lstrip(".") in ("python", "py", "python3"):
                line = page.read_text()[: match.start()].count("\n") + 1
                yield f"{page.relative_to(ROOT)}:{line}", set(info[1:]), match.group(2)


BLOCKS = list(python_blocks())


def test_there_are_blocks_to_run():
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("where, options, code", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_block_runs_or_says_why_not(where, options, code):
    assert "notest" not in options, f"{where}: a block is run, or skipped by a fixture that says why"
    if 'device="cuda' in code:
        assert "fixture:needs_cuda" in options, f"{where} builds a CUDA engine: give it fixture:needs_cuda"
    conftest = (ROOT / "conftest.py").read_text()
    for name in (o.split(":", 1)[1] for o in options if o.startswith("fixture:")):
        assert f"def {name}(" in conftest, f"{where}: no fixture {name} in conftest.py"
