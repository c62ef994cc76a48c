"""Write the measured figures of results/*.json into README.md and docs/**/*.md (issue 14 item 4).

    python tools/render_results.py            # rewrite every results block in place
    python tools/render_results.py --check    # change nothing; exit 1 and name the files that are out of date
    python tools/render_results.py --list     # print every name a block may use

Each reproduction writes one JSON file (`minikv repro scale-wipe --results results/scale_wipe.json`; the shape is
described in CONTRIBUTING.md, "Results files"). A page quotes a figure through a marked block, which this tool
fills from the file, so the prose and the tables cannot drift from the computation:

    <!-- results:scale_wipe.tables.damage -->          a table: its caption, the Markdown table and its source
    ...                                                 (everything between the markers is replaced)
    <!-- /results -->

    the wiped K grows by <!-- results:scale_wipe.quantities.k_inflation -->x41<!-- /results -->

A quantity is replaced by its `display` string. Rendering is idempotent: a second run changes nothing. A name that
no results file defines is an error that names the file, the line and the names that do exist.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- results:(?P<name>[^\s>]*) -->(?P<body>.*?)<!-- /results -->", re.DOTALL)
REQUIRED_KEYS = ("name", "command", "quantities", "tables")


class ResultsError(ValueError):
    """A results file or a results block that cannot be used; the message says what to fix."""


def load_results(results_dir: Path) -> dict[str, dict]:
    """Every results/NAME.json, checked for the schema's shape, keyed by NAME."""
    out = {}
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ResultsError(f"{path}: not valid JSON ({e}); re-run `make results`") from e
        missing = [k for k in REQUIRED_KEYS if k not in data]
        if missing:
            raise ResultsError(f"{path}: missing key(s) {missing}; a results file needs {list(REQUIRED_KEYS)}")
        if data["name"] != path.stem:
            raise ResultsError(f"{path}: \"name\" is {data['name']!r} but the file stem is {path.stem!r}; "
                               "they must be the same")
        for q, entry in data["quantities"].items():
            if not isinstance(entry, dict) or not isinstance(entry.get("display"), str):
                raise ResultsError(f"{path}: quantity {q!r} needs a \"display\" string")
        for t, table in data["tables"].items():
            if not isinstance(table, dict) or not {"columns", "rows"} <= set(table):
                raise ResultsError(f"{path}: table {t!r} needs \"columns\" and \"rows\"")
            bad = [i for i, row in enumerate(table["rows"]) if len(row) != len(table["columns"])]
            if bad:
                raise ResultsError(f"{path}: table {t!r}: row(s) {bad} do not have {len(table['columns'])} cells")
        out[path.stem] = data
    return out


def known_names(results: dict[str, dict]) -> list[str]:
    return [f"{stem}.{kind}.{key}" for stem, data in results.items()
            for kind in ("quantities", "tables") for key in data[kind]]


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return format(value, "g")
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_table(data: dict, key: str) -> str:
    """The Markdown of one table: caption, table (numeric columns right-aligned), the command it came from."""
    table = data["tables"][key]
    numeric = [all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in table["rows"])
               and bool(table["rows"]) for i in range(len(table["columns"]))]
    lines = []
    if table.get("caption"):
        lines += [table["caption"], ""]
    lines.append("| " + " | ".join(_cell(c) for c in table["columns"]) + " |")
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
    lines += ["", f"(`results/{data['name']}.json`, written by `{data['command']}`)"]
    return "\n".join(lines)


def render_value(results: dict[str, dict], name: str) -> str:
    """What goes between the markers of block `name` (a table with blank lines around it, or a display string)."""
    parts = name.split(".")
    if len(parts) != 3 or parts[1] not in ("quantities", "tables"):
        raise ResultsError(f"bad results name {name!r}: write STEM.quantities.KEY or STEM.tables.KEY")
    stem, kind, key = parts
    if stem not in results or key not in results[stem][kind]:
        raise ResultsError(f"unknown results name {name!r}")
    if kind == "quantities":
        return results[stem]["quantities"][key]["display"]
    return "\n" + render_table(results[stem], key) + "\n"


def render_text(text: str, results: dict[str, dict], where: str = "<text>") -> str:
    """`text` with every results block filled in; ResultsError (with file and line) for a name not defined."""
    def fill(match: re.Match) -> str:
        name = match.group("name")
        try:
            value = render_value(results, name)
        except ResultsError as e:
            line = text.count("\n", 0, match.start()) + 1
            names = ", ".join(known_names(results)) or "none (results/ holds no *.json: run `make results`)"
            raise ResultsError(f"{where}:{line}: {e}; known names: {names}") from None
        return f"<!-- results:{name} -->{value}<!-- /results -->"

    return BLOCK.sub(fill, text)


def target_files(repo: Path) -> list[Path]:
    return [p for p in [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))] if p.exists()]


def render_repo(repo: Path = REPO, write: bool = True) -> list[Path]:
    """Render README.md and docs/**/*.md from repo/results; return the files whose text changed (or would)."""
    results = load_results(repo / "results")
    changed = []
    for path in target_files(repo):
        text = path.read_text()
        new = render_text(text, results, str(path.relative_to(repo)))
        if new != text:
            changed.append(path)
            if write:
                path.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is out of date")
    p.add_argument("--list", action="store_true", help="print the names the results files define")
    p.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        if args.list:
            print("\n".join(known_names(load_results(args.repo / "results"))))
            return 0
        changed = render_repo(args.repo, write=not args.check)
    except ResultsError as e:
        print(f"render_results: {e}", file=sys.stderr)
        return 2
    rel = [str(c.relative_to(args.repo)) for c in changed]
    if args.check:
        if rel:
            print("out of date with results/*.json: " + ", ".join(rel) + " (run `python tools/render_results.py`)")
            return 1
        print("README.md and docs are in sync with results/*.json")
        return 0
    print(f"rendered results into {len(rel)} file(s)" + (": " + ", ".join(rel) if rel else " (all in sync)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
