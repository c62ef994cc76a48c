"""The package reads as code: docstrings stay a small share of minikv/ and kernels/, and a module docstring says
what its file is for in a few lines (longer explanations live in docs/, e.g. docs/internals.md)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_DOCSTRING_SHARE = 0.08
MAX_MODULE_DOCSTRING_LINES = 6


def docstring_lines(tree: ast.Module) -> tuple[int, int]:
    """(source lines of every module, class and function docstring; text lines of the module docstring, the
    closing quotes' own line not counted)."""
    total = module = 0
    for node in ast.walk(tree):
        doc = isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
            and ast.get_docstring(node, clean=False)
        if doc is not None and doc is not False:
            total += node.body[0].end_lineno - node.body[0].lineno + 1
            if isinstance(node, ast.Module):
                module = len(doc.rstrip().splitlines())
    return total, module


def package_files() -> list[Path]:
    return sorted(p for d in ("minikv", "kernels") for p in (ROOT / d).rglob("*.py"))


def test_docstring_lines_measure_what_they_say():
    tree = ast.parse('"""One.\n\nTwo.\n"""\nclass A:\n    """A."""\n    def f(self):\n        """F\n        g."""\n')
    assert docstring_lines(tree) == (4 + 1 + 2, 3)
    assert docstring_lines(ast.parse("x = 1\n'''not a docstring'''\n")) == (0, 0)


def test_docstrings_are_a_small_share_of_the_package():
    doc = lines = 0
    for path in package_files():
        text = path.read_text()
        doc += docstring_lines(ast.parse(text))[0]
        lines += len(text.splitlines())
    print(f"\ndocstrings: {doc} of {lines} lines ({doc / lines:.1%}; at most {MAX_DOCSTRING_SHARE:.0%})")
    assert doc <= MAX_DOCSTRING_SHARE * lines, \
        f"docstrings are {doc / lines:.1%} of the package (at most {MAX_DOCSTRING_SHARE:.0%}): move explanations to docs/"


def test_module_docstrings_are_short():
    long = {str(p.relative_to(ROOT)): n for p in package_files()
            if (n := docstring_lines(ast.parse(p.read_text()))[1]) > MAX_MODULE_DOCSTRING_LINES}
    assert not long, f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (say what the file is for; " \
                     f"explanations go to docs/): {long}"
