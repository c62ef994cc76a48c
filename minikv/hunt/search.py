"""The search: hypothesis over engine configurations, cell by cell, until an invariant fails or the budget ends.
See docs/internals.md#hunt-search."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from tqdm import tqdm

from . import oracles as oracle_module
from .minikv_engine import MinikvEngine
from .oracles import Violation
from .reference import DenseReference
from .scenario import Scenario
from .strategies import cell_label, scenarios
from .strategies import cells as all_cells


class _NoConstants:
    def set_for_type(self, choice_type):
        return ()


@contextlib.contextmanager
def _no_source_constants():
    """Keep hypothesis from scanning local source files while the hunter searches."""
    try:
        from hypothesis.internal.conjecture import providers
        hook, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
    except (ImportError, AttributeError):
        yield
        return
    cache.cache.clear()
    providers._get_local_constants = _NoConstants
    try:
        yield
    finally:
        providers._get_local_constants = hook
        cache.cache.clear()


class _Violated(Exception):
    def __init__(self, scenario: Scenario, violations: list[Violation]):
        super().__init__(violations[0].summary)
        self.scenario, self.violations = scenario, violations


@dataclass
class Finding:
    scenario: Scenario                  # the minimal failing scenario hypothesis shrank to
    violations: list[Violation]         # every oracle it violates
    snippet: str                        # Python that reproduces it
    cell: tuple[str, str, str]
    scenarios_before: int               # scenarios run before the first failing one
    seconds_to_find: float
    shrink_runs: int


@dataclass
class HuntReport:
    finding: Finding | None
    scenarios_run: int
    refused: int                        # scenarios the engine refused (outside its domain)
    rounds: int
    cells: list
    seconds: float
    stopped_by: str                     # "finding", "budget" or "scenarios"
    refusals: dict = field(default_factory=dict)   # cell -> the engine's first refusal message
    tried: list = field(default_factory=list)      # every scenario run, in order (Scenario objects)
    refused_scenarios: list = field(default_factory=list)   # those the engine refused, in order
    outcomes: list = field(default_factory=list)   # per scenario tried: "passed", "refused" or "failed"
    settings: dict = field(default_factory=dict)   # how the hunt was run (seed, limits, oracles, backend)
    tolerance_used: dict = field(default_factory=dict)    # cell -> largest |logits - reference| / tolerance seen

    @property
    def found(self) -> bool:
        return self.finding is not None

    def to_dict(self) -> dict:
        """The report as JSON-ready data."""
        import dataclasses

        def scenario(s: Scenario) -> dict:
            d = dataclasses.asdict(s)
            d.pop("extra", None)
            return d
        finding = None
        if self.finding is not None:
            f = self.finding
            finding = {"cell": list(f.cell), "cell_label": cell_label(f.cell),
                       "scenario_number": f.scenarios_before + 1, "seconds_to_find": round(f.seconds_to_find, 3),
                       "shrink_runs": f.shrink_runs,
                       "invariants": [{"invariant": v.oracle, "statement": oracle_module.ORACLES[v.oracle].statement,
                                       "summary": v.summary, "seen": v.detail} for v in f.violations],
                       "shrunk_scenario": scenario(f.scenario), "reproduction": f.snippet}
        first = self.finding.scenarios_before if self.finding else len(self.tried)
        tried = [{"number": i + 1, "cell": cell_label((s.model, s.kv_cache_dtype, s.dtype)),
                  "outcome": outcome if i <= first else f"{outcome} (shrinking)", "scenario": scenario(s)}
                 for i, (s, outcome) in enumerate(zip(self.tried, self.outcomes))]
        return {"outcome": "found" if self.found else "clean", "stopped_by": self.stopped_by,
                "settings": dict(self.settings), "cells": [cell_label(c) for c in self.cells],
                "scenarios_run": self.scenarios_run, "refused": self.refused, "rounds": self.rounds,
                "seconds": round(self.seconds, 3),
                "refusals": {cell_label(c): msg for c, msg in self.refusals.items()},
                "tolerance_used": {cell_label(c): float(f"{d:.3g}") for c, d in self.tolerance_used.items()},
                "finding": finding, "scenarios": tried}

    def text(self, portable: bool = False) -> str:
        """The report as the CLI prints it. `portable=True` keeps only what every machine prints alike: no
        timings, and no detail of what was seen (tokens decoded from damaged memory, byte counts)."""
        if self.finding is None:
            if portable:
                return "clean: no invariant failed"
            refused = f", {self.refused} of them refused by the engine" if self.refused else ""
            return (f"clean: {self.scenarios_run} scenarios over {len(self.cells)} cells in {self.seconds:.1f} s"
                    f"{refused}, no invariant failed (stopped by the {self.stopped_by} limit)")
        f = self.finding
        when = "" if portable else f" after {f.seconds_to_find:.1f} s"
        lines = [f"FOUND in cell {cell_label(f.cell)}: scenario {f.scenarios_before + 1}{when}, shrunk in "
                 f"{f.shrink_runs} runs"]
        for v in f.violations:
            lines.append(f"  invariant {v.oracle}: {oracle_module.ORACLES[v.oracle].statement}")
            lines.append(f"    {v.summary}")
            if v.detail and not portable:
                lines.append(f"    seen: {v.detail}")
        lines.append("reproduction:")
        lines.append(f.snippet)
        return "\n".join(lines)


def hunt(engine=None, *, model=None, reintroduce=(), instrument=None, backend: str = "torch", seed: int = 0,
         budget_s: float | None = 60.0, max_scenarios: int | None = None, max_shrink_runs: int = 40,
         oracles=None, cells=None, reference=None, progress: bool | None = None,
         threads: int | None = 1) -> HuntReport:
    """Search engine configurations for a violated invariant."""
    if budget_s is None and max_scenarios is None:
        raise ValueError("give budget_s or max_scenarios (or both): the search needs a limit")
    if oracles is not None:
        unknown = sorted(set(oracles) - set(oracle_module.ORACLES))
        if unknown:
            raise ValueError(f"unknown oracle(s) {unknown}; known: {', '.join(oracle_module.ORACLES)}")
    if model is not None:
        if cells is not None:
            raise ValueError("give model= or cells=, not both (cells name their models)")
        model = check_model(model)
        cells = all_cells(models=[model])
    settings = {"seed": seed, "budget_s": budget_s, "max_scenarios": max_scenarios,
                "max_shrink_runs": max_shrink_runs, "oracles": list(oracles or oracle_module.ORACLES),
                "backend": backend if engine is None else type(engine).__name__}
    engine = engine or MinikvEngine(reintroduce, backend=backend, instrument=instrument)
    search = _Search(engine, reference or DenseReference(), oracles, budget_s, max_scenarios, max_shrink_runs,
                     progress)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        report = search.run(cells or all_cells(), seed)
        report.settings = settings
        return report
    finally:
        torch.set_num_threads(before)


def check_model(model) -> str:
    """A model the hunter can take, as the string its cells name: a shipped model's name, or a checkpoint
    directory's path (absolute, so a printed reproduction runs from anywhere)."""
    from pathlib import Path

    from minikv.models import registry

    from .strategies import prompt_pool
    name = registry.check_model(model)
    if not registry.is_checkpoint_model(name):
        name = str(Path(name).resolve())
        registry.get_tokenizer(name)
        registry.load_model(name)
    prompt_pool(name)
    return name


def _snippet(engine, scenario, violations) -> str:
    """The engine's reproduction of a finding: one that checks the violations, where the adapter can write one."""
    import inspect
    try:
        takes = len(inspect.signature(engine.snippet).parameters) >= 2
    except (TypeError, ValueError):
        takes = False
    return engine.snippet(scenario, violations) if takes else engine.snippet(scenario)


class _Search:
    def __init__(self, engine, reference, oracle_names, budget_s, max_scenarios, max_shrink_runs, progress):
        self.engine, self.reference, self.oracle_names = engine, reference, oracle_names
        self.budget_s, self.max_scenarios, self.max_shrink_runs = budget_s, max_scenarios, max_shrink_runs
        self.results: dict[tuple, list[Violation]] = {}
        self.runs = self.refused = self.shrink_runs = 0
        self.found_at: tuple[int, float] | None = None
        self.refusals: dict = {}
        self.tried: list[Scenario] = []
        self.refused_tried: list[Scenario] = []
        self.outcomes: list[str] = []
        self.deviation: dict = {}
        self.bar = tqdm(total=max_scenarios, desc="hunt", unit="scenario", leave=False,
                        disable=None if progress is None else not progress)   # None: off unless a terminal

    def _elapsed(self) -> float:
        return time.monotonic() - self.start

    def _exhausted(self) -> str | None:
        if self.found_at is not None:
            return "shrink" if self.shrink_runs >= self.max_shrink_runs else None
        if self.budget_s is not None and self._elapsed() >= self.budget_s:
            return "budget"
        if self.max_scenarios is not None and self.runs >= self.max_scenarios:
            return "scenarios"
        return None

    def evaluate(self, scenario: Scenario, cell) -> list[Violation] | None:
        """The violations of a scenario's run (cached); None when the budget left it unrun."""
        key = scenario.key()
        if key in self.results:
            return self.results[key]
        if self._exhausted():
            return None
        run = self.engine.run(scenario)
        self.tried.append(scenario)
        self.runs += 1
        self.bar.update(1)
        if self.found_at is not None:
            self.shrink_runs += 1
        if run.refused:
            self.refused += 1
            self.refused_tried.append(scenario)
            self.refusals.setdefault(cell, run.refused)
            found = []
        else:
            needs_ref = any(oracle_module.ORACLES[n].needs_reference for n in (self.oracle_names or
                                                                              oracle_module.ORACLES))
            refs = {}
            if needs_ref and not run.error:
                longest: dict[str, int] = {}
                for r in scenario.requests:
                    longest[r.prompt] = max(longest.get(r.prompt, 0), r.max_tokens)
                refs = {p: self.reference.get(scenario.model, scenario.kv_cache_dtype, scenario.dtype, p, n)
                        for p, n in longest.items()}
            found = oracle_module.check(run, refs, self.oracle_names)
            d = oracle_module.tolerance_used(run, refs) if refs else None
            if d is not None:
                self.deviation[cell] = max(d, self.deviation.get(cell, 0.0))
        if found and self.found_at is None:
            self.found_at = (self.runs - 1, self._elapsed())
        self.results[key] = found
        self.outcomes.append("refused" if run.refused else "failed" if found else "passed")
        return found

    def _search_cell(self, cell, examples: int, seed: int) -> _Violated | None:
        @hypothesis_seed(seed)
        @settings(database=None, max_examples=examples, deadline=None, phases=(Phase.generate, Phase.shrink),
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False, verbosity=Verbosity.quiet,
                  print_blob=False)
        @given(scenarios(cell))
        def probe(scenario):
            found = self.evaluate(scenario, cell)
            if found:
                raise _Violated(scenario, found)

        try:
            probe()
        except _Violated as v:
            return v
        return None

    def run(self, cells, seed: int) -> HuntReport:
        self.start = time.monotonic()
        rounds, violated, stopped, cell = 0, None, None, None
        try:
            with _no_source_constants():
                while violated is None and stopped is None:
                    for index, cell in enumerate(cells):
                        violated = self._search_cell(cell, 2 ** rounds, seed * 1009 + index)
                        stopped = "finding" if violated else self._exhausted()
                        if stopped:
                            break
                    rounds += 1
                    if self.runs and self.refused == self.runs:
                        first = next(iter(self.refusals.values()))
                        raise ValueError(f"the engine refused every scenario of every cell, so nothing can be "
                                         f"tested; its first refusal: {first}")
        finally:
            self.bar.close()
        finding = None
        if violated is not None:
            runs_before, seconds = self.found_at
            finding = Finding(violated.scenario, violated.violations,
                              _snippet(self.engine, violated.scenario, violated.violations), cell,
                              runs_before, seconds, self.shrink_runs)
        return HuntReport(finding, self.runs, self.refused, rounds, list(cells), self._elapsed(), stopped,
                          self.refusals, self.tried, self.refused_tried, self.outcomes,
                          tolerance_used=dict(self.deviation))
