"""minikv.hunt end to end: each historical defect found blind, the fixed engine clean, the search order independent of
the defect tuple, the shrunk reproduction ready to run, and the hunter's source blind by construction.

The hunts are bounded by scenario counts (not seconds), so they try the same scenarios on every machine. All of
them run once, in a module fixture, from a scratch working directory that must stay free of hypothesis files.
"""
from __future__ import annotations

import ast
import contextlib
import io
import os
from pathlib import Path

import pytest

import minikv
from minikv.hunt import MinikvEngine, hunt
from minikv.hunt.reference import DenseReference
from minikv.hunt.strategies import cells

HUNT_DIR = Path(minikv.__file__).parent / "hunt"
DEFECTS = tuple(minikv.bugs.DEFECTS)
# Which invariant fails first for each defect: written here, by the test, never in the hunter.
EXPECTED = {"scale-wipe": "matches-reference", "cross-stride": "writes-in-bounds",
            "cross-fp8-context-read": "matches-reference"}
FIXED_SCENARIOS = 24          # more than any defect below needs before its finding
DEFECT_SCENARIOS = 48


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    path = tmp_path_factory.mktemp("hunt_cwd")
    before = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(before)


@pytest.fixture(scope="module")
def reference():
    return DenseReference()          # shared: the dense references are cached per prompt


@pytest.fixture(scope="module")
def fixed(scratch, reference):
    return hunt(max_scenarios=FIXED_SCENARIOS, budget_s=None, reference=reference, progress=False)


@pytest.fixture(scope="module")
def engines():
    """One engine adapter per defect, remembering its runs (a second hunt over it pays only for new scenarios)."""
    return {name: MinikvEngine(reintroduce=(name,), remember=True) for name in DEFECTS}


@pytest.fixture(scope="module")
def found(scratch, reference, engines):
    return {name: hunt(engine=engines[name], max_scenarios=DEFECT_SCENARIOS, budget_s=None, reference=reference,
                       progress=False) for name in DEFECTS}


def test_expectations_cover_every_registered_defect():
    assert set(EXPECTED) == set(DEFECTS)


@pytest.mark.parametrize("name", DEFECTS)
def test_each_historical_defect_is_found_and_its_invariant_named(found, name):
    report = found[name]
    assert report.found, report.text()
    assert EXPECTED[name] in [v.oracle for v in report.finding.violations]
    assert report.stopped_by == "finding"
    text = report.text(portable=True)
    assert f"invariant {EXPECTED[name]}:" in text and "minikv.LLM(" in text


def test_the_fixed_engine_comes_out_clean(fixed):
    assert not fixed.found, fixed.text()
    assert fixed.scenarios_run == FIXED_SCENARIOS and fixed.refused == 0
    assert {(s.model, s.kv_cache_dtype, s.dtype) for s in fixed.tried} == set(cells())   # every cell ran
    assert fixed.text(portable=True) == "clean: no invariant failed"


@pytest.mark.parametrize("name", DEFECTS)
def test_up_to_its_finding_the_search_tries_what_it_tries_on_the_fixed_engine(fixed, found, name):
    """Blind in behaviour: the scenarios tried before the first failure are the fixed engine's, in its order."""
    before = found[name].finding.scenarios_before
    assert 0 < before <= len(fixed.tried)
    assert found[name].tried[:before] == fixed.tried[:before]


def _run_snippet(code: str) -> tuple[int, str]:
    """(exit status, stdout) of a reproduction run as printed."""
    out = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, "<snippet>", "exec"), {})
        except SystemExit as done:
            status = done.code
    return status, out.getvalue()


@pytest.mark.parametrize("name", DEFECTS)
def test_each_reproduction_fails_visibly_only_with_the_defect(found, reference, name):
    """Run as printed, a finding's reproduction prints what was expected beside what was seen and exits 1; with the
    defect switched off it exits 0."""
    finding = found[name].finding
    switch = f"reintroduce=({name!r},)"
    assert switch in finding.snippet
    status, out = _run_snippet(finding.snippet)
    assert status == 1, out
    assert "expected" in out and "seen" in out
    fixed_status, fixed_out = _run_snippet(finding.snippet.replace(switch, "reintroduce=()"))
    assert fixed_status == 0, fixed_out
    if EXPECTED[name] == "writes-in-bounds":          # shown by the engine's own sanitizer: the guard zone hit
        assert "sanitize=True" in finding.snippet and "KVCacheOverrunError" in out and "guard hit" in out
    if EXPECTED[name] == "matches-reference" and name == "cross-fp8-context-read":
        scenario = finding.scenario
        assert len(scenario.requests) == 1 and not scenario.repeat        # shrunk to one request, one wave
        request = scenario.requests[0]
        want = list(reference.get(scenario.model, scenario.kv_cache_dtype, scenario.dtype, request.prompt)
                    .token_ids[: request.max_tokens])
        assert f"matches-reference: expected {want}" in out and f"matches-reference: expected {want}" in fixed_out


def test_the_check_upstream_lacked_finds_the_scale_wipe_alone(scratch, reference, engines, found):
    """vLLM had no test comparing the first batch with a later one; that one invariant finds defect A."""
    report = hunt(engine=engines["scale-wipe"], oracles=("repeat-identical",), max_scenarios=DEFECT_SCENARIOS,
                  budget_s=None, reference=reference, progress=False)
    assert report.found and {v.oracle for v in report.finding.violations} == {"repeat-identical"}
    assert report.finding.scenario.repeat


def test_an_engine_that_refuses_everything_is_a_usage_error(scratch):
    with pytest.raises(ValueError, match="refused every scenario"):
        hunt(reintroduce=("scale-wipe",), cells=[("tiny-t5", "fp8", "float16")], max_scenarios=4, budget_s=None,
             progress=False)


def test_nothing_is_written_into_the_working_directory(found, fixed, scratch):
    assert list(scratch.iterdir()) == []


# ---- blind by construction --------------------------------------------------------------------------------------

def _sources():
    return {p.name: p.read_text() for p in sorted(HUNT_DIR.glob("*.py"))}


def test_the_hunter_never_names_a_defect_nor_reads_the_registry():
    spellings = {s for name in DEFECTS for s in (name, name.replace("-", "_"), name.replace("-", " "))}
    identifiers = ("HISTORICAL", "bugs.", "DEFECTS", "minikv.repro", "minikv.defects", "reintroduce_")
    for file, text in _sources().items():
        for s in spellings:
            assert s.lower() not in text.lower(), f"minikv/hunt/{file} mentions {s!r}"
        for s in identifiers:
            assert s not in text, f"minikv/hunt/{file} mentions {s!r}"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("minikv.bugs", "minikv.repro") and "bugs" not in (node.module or "")
                assert "defects" not in (node.module or "")
                assert all(a.name not in ("bugs", "defects") for a in node.names)
            if isinstance(node, ast.Import):
                assert all("bugs" not in a.name and "defects" not in a.name and "repro" != a.name.split(".")[-1]
                           for a in node.names)


def test_the_defect_tuple_is_only_passed_through():
    """Wherever `reintroduce` appears in the hunter, it is stored, passed on or printed: never compared, tested,
    iterated, indexed or unpacked."""
    seen = 0
    for file, text in _sources().items():
        tree = ast.parse(text)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            named = (isinstance(node, ast.Name) and node.id == "reintroduce") or \
                    (isinstance(node, ast.Attribute) and node.attr == "reintroduce")
            if not named:
                continue
            seen += 1
            parent = parents[node]
            if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and node in parent.args:
                if parent.func.id == "MinikvEngine":
                    continue                                  # handed to the engine adapter, which passes it on
                assert parent.func.id == "tuple", f"{file}:{node.lineno}: reintroduce given to {parent.func.id}"
                node, parent = parent, parents[parent]        # tuple(reintroduce): look at where the copy goes
            where = f"minikv/hunt/{file}:{node.lineno}"
            if isinstance(parent, ast.Assign):
                assert node in parent.targets or parent.value is node, where
            else:
                assert isinstance(parent, ast.keyword), f"{where}: `reintroduce` used in a {type(parent).__name__}"
    assert seen >= 3
