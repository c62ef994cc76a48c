"""The backend hunt: the scenario families (families.py) against one attention backend, at kernel level.

`hunt_backend("flexattention", budget_s=60).text()` (or any AttentionBackend instance): pass / fail / skipped (why)
per family. Families take turns in seeded rounds of 1, 2, 4, ... cases; a failing family is shrunk at once and
leaves the rotation, its finding printed as a program that rebuilds the case, checks it and exits 1 (`program`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed

from .families import FAMILIES, cases, coverage_note, skip_reason
from .kernel_case import INVARIANTS, KernelCase, Violation, check
from .search import _no_source_constants


class _Failed(Exception):
    def __init__(self, case: KernelCase, violations: list[Violation]):
        super().__init__(violations[0].summary)
        self.case, self.violations = case, violations


@dataclass
class FamilyResult:
    name: str
    statement: str
    outcome: str = "pass"                 # "pass", "fail", "skipped", or "untested" (the limit came first)
    why: str = ""                         # skipped: the reason; otherwise what the backend leaves out, if anything
    scenarios: int = 0
    case: KernelCase | None = None        # a failure's shrunk case
    violations: list = field(default_factory=list)
    program: str = ""
    seconds_to_find: float | None = None  # from the start of the hunt to the first failing case
    scenario_number: int | None = None    # of the hunt's scenarios, the first failing one
    shrink_runs: int = 0


@dataclass
class BackendReport:
    backend: str
    recipe: str
    device: str
    families: list
    scenarios_run: int
    seconds: float
    stopped_by: str
    settings: dict = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return any(f.outcome == "fail" for f in self.families)

    def first_finding(self) -> FamilyResult | None:
        failed = [f for f in self.families if f.outcome == "fail"]
        return min(failed, key=lambda f: f.scenario_number) if failed else None

    def text(self, portable: bool = False) -> str:
        """The report as the CLI prints it (`portable`: no timings, no values that depend on float rounding)."""
        when = "" if portable else f" in {self.seconds:.1f} s"
        verdict = "FOUND" if self.found else "clean"
        head = (f"backend {self.backend} ({self.device}): {self.scenarios_run} scenarios{when}, {verdict} "
                f"(stopped by the {self.stopped_by} limit)")
        lines = [head]
        for f in self.families:
            extra = f" ({f.why})" if f.why else ""
            count = "" if f.outcome == "skipped" else f", {f.scenarios} scenarios"
            lines.append(f"  {f.name:15s} {f.outcome}{count}{extra}")
        for f in self.families:
            if f.outcome != "fail":
                continue
            after = "" if portable else f" after {f.seconds_to_find:.1f} s"
            lines.append(f"FOUND in family {f.name}: scenario {f.scenario_number}{after}, shrunk in {f.shrink_runs} "
                         f"runs")
            for v in f.violations:
                lines.append(f"  invariant {v.invariant}: {INVARIANTS[v.invariant]}")
                lines.append(f"    {v.summary if not portable else v.summary.split(' is off by')[0]}")
            lines.append("reproduction:")
            lines.append(f.program)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        fams = []
        for f in self.families:
            d = {"family": f.name, "statement": f.statement, "outcome": f.outcome, "why": f.why,
                 "scenarios": f.scenarios}
            if f.outcome == "fail":
                d.update(seconds_to_find=round(f.seconds_to_find, 3), scenario_number=f.scenario_number,
                         shrink_runs=f.shrink_runs, shrunk_case=f.case.code(), reproduction=f.program,
                         invariants=[{"invariant": v.invariant, "summary": v.summary} for v in f.violations])
            fams.append(d)
        return {"backend": self.backend, "recipe": self.recipe, "device": self.device,
                "outcome": "found" if self.found else "clean", "stopped_by": self.stopped_by,
                "settings": dict(self.settings), "scenarios_run": self.scenarios_run,
                "seconds": round(self.seconds, 3), "families": fams}


def recipe(backend) -> tuple[str, str]:
    """(the import, the expression) that rebuild `backend` in a printed program."""
    if type(backend).__name__ == "KernelOps":
        return "import minikv.attention.backend", f"minikv.attention.backend.get_ops({backend.name!r})"
    module = type(backend).__module__
    if module == "__main__" or "." not in repr(backend) or repr(backend).startswith("<"):
        return "", f"{type(backend).__qualname__}()   # your backend: define or import it above"
    text = repr(backend)
    return f"import {text.split('(')[0].rsplit('.', 1)[0]}", text


def program(backend, case: KernelCase, violations: list[Violation]) -> str:
    """A program that rebuilds `case`, runs it on `backend`, prints what was expected and seen, and exits 1."""
    imports, expression = recipe(backend)
    lines = ["import sys", ""] + ([imports] if imports else []) + [
        "from minikv.hunt.kernel_case import KernelCase, replay_case", "",
        f"# invariant {violations[0].invariant}: {INVARIANTS[violations[0].invariant]}",
        f"backend = {expression}",
        f"case = {case.code()}",
        "sys.exit(replay_case(backend, case))"]
    return "\n".join(lines)


def resolve(backend):
    """An AttentionBackend from a name (minikv's "triton" / "torch", or an adapter's) or an instance."""
    if isinstance(backend, str):
        from minikv.attention.backend import get_ops
        from minikv.config import check_backend
        check_backend(backend)
        return get_ops(backend)
    return backend


class _Hunt:
    def __init__(self, backend, device, budget_s, max_scenarios, max_shrink_runs):
        self.backend, self.device = backend, device
        self.budget_s, self.max_scenarios, self.max_shrink_runs = budget_s, max_scenarios, max_shrink_runs
        self.results: dict[KernelCase, list] = {}
        self.runs = 0
        self.start = time.monotonic()
        self.current: FamilyResult | None = None

    def _exhausted(self) -> str | None:
        f = self.current
        if f is not None and f.seconds_to_find is not None:
            return "shrink" if f.shrink_runs >= self.max_shrink_runs else None
        if self.budget_s is not None and time.monotonic() - self.start >= self.budget_s:
            return "budget"
        if self.max_scenarios is not None and self.runs >= self.max_scenarios:
            return "scenarios"
        return None

    def evaluate(self, case: KernelCase) -> list:
        if case in self.results:
            return self.results[case]
        if self._exhausted():
            return []
        found = check(self.backend, case, self.device)
        self.runs += 1
        f = self.current
        f.scenarios += 1
        if f.seconds_to_find is not None:
            f.shrink_runs += 1
        elif found:
            f.seconds_to_find, f.scenario_number = time.monotonic() - self.start, self.runs
        self.results[case] = found
        return found

    def search(self, f: FamilyResult, features, examples: int, seed: int) -> _Failed | None:
        self.current = f

        @hypothesis_seed(seed)
        @settings(database=None, max_examples=examples, deadline=None, phases=(Phase.generate, Phase.shrink),
                  suppress_health_check=list(HealthCheck), report_multiple_bugs=False, verbosity=Verbosity.quiet,
                  print_blob=False)
        @given(cases(f.name, features))
        def probe(case):
            found = self.evaluate(case)
            if found:
                raise _Failed(case, found)
        try:
            probe()
        except _Failed as failed:
            return failed
        return None


def warm_up(backend, device: str | None = None) -> list:
    """Run one case of each kernel variant a hunt calls (every format, head size, decode and context, windowed,
    causal and cross), so that a backend that compiles on first use (FlashInfer's JIT) is not timed compiling.
    Returns the violations seen (a clean backend: [])."""
    from minikv.attention.protocol import Features
    features = getattr(backend, "features", None) or Features()
    found = []
    variants = [("decode", True, 0), ("context", True, 0), ("context", False, 0)]
    if features.sliding_window:
        variants += [("decode", True, 4), ("context", True, 4)]
    for fmt in features.formats:
        for head in features.head_sizes:
            for step, causal, window in variants:
                case = KernelCase("warm-up", step=step, kv_cache_dtype=fmt, dtype=features.dtypes[0], head_size=head,
                                  block_size=16 if 16 in features.block_sizes else features.block_sizes[0],
                                  group=2, seq_lens=(20, 9), causal=causal, sliding_window=window,
                                  scale_placement=features.placements[0])
                found += check(backend, case, device or features.device)
    return found


def hunt_backend(backend="flexattention", *, families=None, seed: int = 0, budget_s: float | None = 60.0,
                 max_scenarios: int | None = None, max_shrink_runs: int = 40, device: str | None = None,
                 stop_at_first: bool = False, threads: int | None = 1) -> BackendReport:
    """Hunt `backend` (a name or an AttentionBackend) over the families (default all) with minikv's float64
    reference as the oracle. `budget_s` / `max_scenarios` bound the search (shrinking comes on top);
    `stop_at_first` ends the hunt at the first failing family (for timing a planted defect). The clock starts
    after one plain warm-up case, so a backend's start-up (imports, tracing, compiling) is not counted."""
    if budget_s is None and max_scenarios is None:
        raise ValueError("give budget_s or max_scenarios (or both): the search needs a limit")
    names = list(families or FAMILIES)
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown famil(ies) {unknown}; known: {', '.join(FAMILIES)}")
    from minikv.attention.protocol import Features
    backend = resolve(backend)
    features = getattr(backend, "features", None) or Features()
    device = device or features.device
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"backend {backend.name} runs on CUDA, and this machine has none")
    results = [FamilyResult(n, FAMILIES[n].statement) for n in names]
    for f in results:
        reason = skip_reason(f.name, features)
        f.outcome, f.why = ("skipped", reason) if reason else ("pass", coverage_note(f.name, features))
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    # one plain case before the clock starts: a backend's one-time start-up (imports, tracing, a JIT) is not hunting
    check(backend, KernelCase("warm-up", dtype=features.dtypes[0], head_size=64 if 64 in features.head_sizes
                              else features.head_sizes[0], block_size=16 if 16 in features.block_sizes
                              else features.block_sizes[0]), device)
    hunt = _Hunt(backend, device, budget_s, max_scenarios, max_shrink_runs)
    stopped, rounds = None, 0
    try:
        with _no_source_constants():
            while stopped is None:
                active = [f for f in results if f.outcome == "pass"]
                if not active:
                    stopped = "finding"
                    break
                runs_before = hunt.runs
                for f in active:
                    failed = hunt.search(f, features, 2 ** rounds, seed * 1009 + names.index(f.name))
                    hunt.current = None
                    if failed is not None:
                        f.outcome, f.case, f.violations = "fail", failed.case, failed.violations
                        f.program = program(backend, failed.case, failed.violations)
                        if stop_at_first:
                            stopped = "finding"
                            break
                    stopped = stopped or hunt._exhausted()
                    if stopped:
                        break
                rounds += 1
                if stopped is None and hunt.runs == runs_before and rounds > 12:
                    stopped = "exhausted"          # every family has run every case it can draw
    finally:
        torch.set_num_threads(before)
    for f in results:
        if f.outcome == "pass" and not f.scenarios:
            f.outcome, f.why = "untested", "the limit came before its first scenario"
    return BackendReport(getattr(backend, "name", type(backend).__name__), " ".join(recipe(backend)).strip(), device,
                         results, hunt.runs, time.monotonic() - hunt.start, stopped,
                         {"seed": seed, "budget_s": budget_s, "max_scenarios": max_scenarios,
                          "max_shrink_runs": max_shrink_runs, "families": names})
