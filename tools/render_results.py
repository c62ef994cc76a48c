"""Write the measured figures of the results sources into README.md and docs/**/*.md (one number per quantity).

    python tools/render_results.py            # rewrite every results block in place
    python tools/render_results.py --check    # change nothing; exit 1 and name the files that are out of date
    python tools/render_results.py --list     # print every name a block may use

A page quotes a figure through a marked block, which this tool fills from its source, so the prose and the tables
cannot drift from the computation:

    <!-- results:scale_wipe.tables.damage -->          a table, on lines of its own: its caption, the Markdown
    ...                                                 table and its source (everything between the markers is
    <!-- /results -->                                   replaced)

    the wiped K grows by <!-- results:scale_wipe.quantities.k_inflation -->x41<!-- /results -->

A quantity is replaced by its `display` string. An inline quantity block never starts a line: a line that starts
with an HTML comment is an HTML block to Markdown (on the built site and on GitHub), which splits the paragraph.
A table block's markers stand alone on their lines. Both rules are errors here, with the file and the line.

The sources (results/*.json, the GPU runs, the CPU logs) are read by tools/results_sources/, each in the
same shape {"name", "command", "quantities", "tables"}.

Rendering is idempotent: a second run changes nothing. A name that no source defines is an error that names the
file, the line and the names that do exist.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # tools/results_sources, also when loaded from a path

from results_sources import (CI_RUN, MAKE_RUN, REPO, ResultsError, cell, compare_cpu_gpu,  # noqa: E402,F401
                             load_cross_stride_cuda, load_gpu, load_make_run, load_results, load_sources,
                             load_test_time, parse_cross_log)

BLOCK = re.compile(r"<!-- results:(?P<name>[^\s>]*) -->(?P<body>.*?)<!-- /results -->", re.DOTALL)


def known_names(results: dict[str, dict]) -> list[str]:
    return [f"{stem}.{kind}.{key}" for stem, data in results.items()
            for kind in ("quantities", "tables") for key in data[kind]]



def render_table(data: dict, key: str) -> str:
    """The Markdown of one table: caption, table (numeric columns right-aligned), the command it came from."""
    table = data["tables"][key]
    numeric = [all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool) for row in table["rows"])
               and bool(table["rows"]) for i in range(len(table["columns"]))]
    lines = []
    if table.get("caption"):
        lines += [table["caption"], ""]
    lines.append("| " + " | ".join(cell(c) for c in table["columns"]) + " |")
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table["rows"]]
    source = data.get("_source") or f"`results/{data['name']}.json`, written by `{data['command']}`"
    lines += ["", f"({source})"]
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
    """`text` with every results block filled in; ResultsError (with file and line) for a name not defined, an
    inline block at the start of a line, or a table block that does not stand on lines of its own."""
    def fill(match: re.Match) -> str:
        name = match.group("name")
        line = text.count("\n", 0, match.start()) + 1
        try:
            value = render_value(results, name)
        except ResultsError as e:
            names = ", ".join(known_names(results)) or "none (results/ holds no *.json: run `make results`)"
            raise ResultsError(f"{where}:{line}: {e}; known names: {names}") from None
        before = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
        after_end = text.find("\n", match.end())
        after = text[match.end():after_end if after_end >= 0 else len(text)]
        if name.split(".")[1] == "quantities" and not before.strip():
            raise ResultsError(f"{where}:{line}: the inline block {name!r} starts a line; Markdown reads a line "
                               "that starts with an HTML comment as an HTML block and splits the paragraph there. "
                               "Rewrap the paragraph so that a word comes first on the line")
        if name.split(".")[1] == "tables" and (before.strip() or after.strip()):
            raise ResultsError(f"{where}:{line}: the table block {name!r} must stand on lines of its own")
        return f"<!-- results:{name} -->{value}<!-- /results -->"

    return BLOCK.sub(fill, text)


def target_files(repo: Path) -> list[Path]:
    return [p for p in [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))] if p.exists()]


def render_repo(repo: Path = REPO, write: bool = True) -> list[Path]:
    """Render README.md and docs/**/*.md from the repo's results sources; return the files whose text changed (or
    would)."""
    results = load_sources(repo)
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
    p.add_argument("--list", action="store_true", help="print the names the results sources define")
    p.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        if args.list:
            results = load_sources(args.repo)
            for name in known_names(results):
                stem, kind, key = name.split(".")
                shown = results[stem][kind][key]["display"] if kind == "quantities" else "(table)"
                print(f"{name}  {shown}")
            return 0
        changed = render_repo(args.repo, write=not args.check)
    except ResultsError as e:
        print(f"render_results: {e}", file=sys.stderr)
        return 2
    rel = [str(c.relative_to(args.repo)) for c in changed]
    if args.check:
        if rel:
            print("out of date with the results sources: " + ", ".join(rel) + " (run `python tools/render_results.py`)")
            return 1
        print("README.md and docs are in sync with the results sources")
        return 0
    print(f"rendered results into {len(rel)} file(s)" + (": " + ", ".join(rel) if rel else " (all in sync)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
