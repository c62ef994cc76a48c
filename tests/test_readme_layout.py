"""The "Package layout" listing of docs/architecture.md against the tree: nothing missing, nothing that does not exist.

A line is `PATH  description` (two or more spaces between); "a/, b  ..." lists two paths; an indented line
continues the description above. Required in the listing, each as its own path:
  - every top-level folder of the repository, except dot-folders (`kernels/`, `minikv/`, `tools/`, ...);
  - every module `minikv/NAME.py` (not `__init__.py` / `__main__.py`) and every subpackage `minikv/NAME/`;
  - every file `kernels/NAME.py` (not `__init__.py`) and every file in `tools/`;
  - every checkpoint directory `minikv/models/weights/NAME/`, named as `NAME/` on the `minikv/models/weights/` line.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


PAGE = ROOT / "docs" / "architecture.md"      # the README links it; the listing moved there from the README


def listing() -> dict[str, str]:
    """path -> its description, from the fenced block under the page's "## Package layout"."""
    text = PAGE.read_text()
    section = text.split("## Package layout", 1)[1]
    block = section.split("```", 2)[1]
    entries: dict[str, str] = {}
    last = None
    for line in block.splitlines()[1:]:
        if not line.strip():
            continue
        if line.startswith(" "):                    # a description continued from the line above
            entries[last] += " " + line.strip()
            continue
        paths, description = (re.split(r"\s{2,}", line.strip(), maxsplit=1) + [""])[:2]
        for path in paths.split(", "):
            entries[path] = description.strip()
            last = path
    return entries


def required() -> set[str]:
    def visible(p: Path) -> bool:
        return not p.name.startswith((".", "__pycache__")) and not p.name.endswith(".egg-info")

    need = {f"{p.name}/" for p in ROOT.iterdir() if p.is_dir() and visible(p) and p.name not in ("build", "site")}
    minikv = ROOT / "minikv"
    need |= {f"minikv/{p.name}" for p in minikv.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    need |= {f"minikv/{p.name}/" for p in minikv.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    need |= {f"kernels/{p.name}" for p in (ROOT / "kernels").glob("*.py") if p.name != "__init__.py"}
    need |= {f"tools/{p.name}" for p in (ROOT / "tools").iterdir() if p.is_file() and visible(p)}
    return need


def test_every_module_folder_and_tool_is_listed():
    missing = sorted(required() - set(listing()))
    assert not missing, f"docs/architecture.md's Package layout does not list {missing}: add a line for each"


def test_everything_listed_exists():
    absent = sorted(p for p in listing() if not (ROOT / p.rstrip("/")).exists())
    assert not absent, f"docs/architecture.md's Package layout lists {absent}, which do not exist"


def test_every_shipped_checkpoint_is_named():
    weights = ROOT / "minikv" / "models" / "weights"
    line = listing().get("minikv/models/weights/", "")
    named = set(re.findall(r"[\w.-]+/", line))
    missing = sorted(p.name for p in weights.iterdir() if p.is_dir() and f"{p.name}/" not in named)
    assert not missing, f"the minikv/models/weights/ line of docs/architecture.md's Package layout does not name {missing}"


def test_readme_links_the_layout():
    assert "docs/architecture.md" in (ROOT / "README.md").read_text(), "README.md does not link docs/architecture.md"


def test_readme_is_a_front_door():
    """At most 150 lines; the detail lives on the pages it links."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines (at most 150)"
    for page in ("docs/architecture.md", "docs/results.md", "docs/checkpoints.md", "docs/hunt.md", "CONTRIBUTING.md"):
        assert f"]({page})" in text, f"README.md does not link {page}"
        assert (ROOT / page).is_file(), page
    for command in ("make setup", "make run", "make test"):
        assert command in text, f"README.md does not name `{command}`"
