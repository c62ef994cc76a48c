"""The invariants: what must hold for every configuration, written without knowing any particular defect.
See docs/internals.md#hunt-oracles."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .record import RequestResult, Run


@dataclass(frozen=True)
class Violation:
    oracle: str
    summary: str                  # one line that every machine prints alike: positions, pool names, outcomes
    detail: str = ""              # what was seen: token ids decoded from damaged memory, byte counts
    # For a reproduction that checks the tokens itself: the (wave, request index) whose tokens were wrong, and
    # what they should have been: the tokens themselves (`expected`, as the engine returns them: no EOS) or those
    # of another request of the same run that must be equal (`expected_at`). None: no token check applies.
    seen_at: tuple[int, int] | None = None
    expected: tuple[int, ...] | None = None
    expected_at: tuple[int, int] | None = None


@dataclass(frozen=True)
class Oracle:
    name: str
    statement: str
    needs_reference: bool
    check: object                 # (run, references) -> list[Violation]


def _full(res: RequestResult, eos_id) -> tuple[int, ...]:
    """The tokens the engine chose, with the EOS it stopped at (the engine reports EOS but does not return it)."""
    return res.token_ids + ((eos_id,) if res.finish_reason == "eos" and eos_id is not None else ())


def _first_difference(a, b) -> int | None:
    """The first position where both sequences have a token and the tokens differ (None: one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def _near_tie(ref, tokens, position: int, other: int | None = None) -> bool:
    """Whether `tokens[position]` and `other` (default: the reference's own token there) are a near tie: the
    reference saw the same tokens before `position`, and its logits there separate the two by at most twice the
    row's tolerance (each of the two logits may move by the tolerance, so their gap by twice that)."""
    if ref is None or position >= len(ref.token_ids) or tuple(ref.token_ids[:position]) != tuple(tokens[:position]):
        return False
    other = ref.token_ids[position] if other is None else other
    return abs(ref.gap(position, other, tokens[position])) <= 2 * ref.allowed(position)


def logit_deviation(engine_row, reference_row) -> float:
    """The largest |engine - reference| over a row of logits."""
    return float((engine_row.double() - reference_row.double()).abs().max())


def _as_returned(tokens, eos_id) -> tuple[int, ...]:
    """Tokens as the engine returns them: a final EOS is where it stopped, not a token it returns."""
    tokens = tuple(tokens)
    return tokens[:-1] if tokens and eos_id is not None and tokens[-1] == eos_id else tokens


# ---- the oracles ---------------------------------------------------------------------------------------------

def runs(run: Run, refs) -> list[Violation]:
    if run.error:
        kind = run.error.split(":")[0]
        return [Violation("runs", f"a configuration the engine accepted raised {kind} ({run.error_at})", run.error)]
    return []


def writes_in_bounds(run: Run, refs) -> list[Violation]:
    if not run.stray_writes:
        return []
    w = run.stray_writes[0]
    more = len(run.stray_writes) - 1
    return [Violation("writes-in-bounds", f"step {w.step} changed bytes of {w.region} outside the rows its slot "
                                          f"mapping names",
                      f"{w.nbytes} byte(s), the first at byte {w.offset} of the region"
                      + (f"; {more} more region(s)/step(s) too" if more else ""))]


def kernels_match_references(run: Run, refs) -> list[Violation]:
    if not run.kernel_mismatches:
        return []
    return [Violation("kernels-match-references", run.kernel_mismatches[0],
                      f"{len(run.kernel_mismatches)} kernel call(s) disagreed with their reference")]


def _kv_difference(a: RequestResult, b: RequestResult) -> str | None:
    if a.kv is None or b.kv is None:
        return None
    for pool in sorted(set(a.kv) | set(b.kv)):
        ra, rb = a.kv.get(pool, ()), b.kv.get(pool, ())
        if len(ra) != len(rb):
            return f"pool {pool} holds {len(ra)} vs {len(rb)} positions"
        for p, (x, y) in enumerate(zip(ra, rb)):
            if x != y:
                what = "codes and scales" if x.codes != y.codes and x.scales != y.scales else \
                    "scales" if x.scales != y.scales else "codes"
                return f"pool {pool}, position {p}: {what} differ"
    return None


def repeat_identical(run: Run, refs) -> list[Violation]:
    """A request submitted again after the first batch finished, and scheduled the same way, runs the same
    computation: the same tokens and, right after its prefill, the same KV bytes."""
    first = {r.index: r for r in run.requests if r.wave == 0}
    out = []
    for later in (r for r in run.requests if r.wave == 1):
        early = first.get(later.index)
        if early is None or early.schedule != later.schedule:
            continue
        if early.token_ids != later.token_ids:
            out.append(Violation("repeat-identical", f"request {later.index} gave other tokens in the first batch "
                                                     f"than when submitted again",
                                 f"{list(early.token_ids)} vs {list(later.token_ids)}",
                                 seen_at=(1, later.index), expected_at=(0, early.index)))
        diff = _kv_difference(early, later)
        if diff:
            out.append(Violation("repeat-identical", f"request {later.index}: its KV bytes after prefill differ "
                                                     f"between the first batch and the later one ({diff})"))
    return out


def schedule_invariant(run: Run, refs) -> list[Violation]:
    """Copies of one request in one run give the same tokens however they were batched, cached, preempted or
    timed (a divergence is allowed only at a near tie of the reference, when there is one)."""
    groups = defaultdict(list)
    for r in run.requests:
        groups[(r.prompt, r.max_tokens)].append(r)
    out = []
    for (prompt, _), copies in groups.items():
        base = copies[0]
        for other in copies[1:]:
            a, b = _full(base, run.eos_id), _full(other, run.eos_id)
            at = _first_difference(a, b)
            if at is None:
                continue
            ref = refs.get(prompt) if refs else None
            if _near_tie(ref, a, at, b[at]):
                continue
            out.append(Violation("schedule-invariant",
                                 f"request {base.index} (wave {base.wave}) and its copy {other.index} (wave "
                                 f"{other.wave}) give different tokens", f"{list(a)} vs {list(b)} from token {at}",
                                 seen_at=(other.wave, other.index), expected_at=(base.wave, base.index)))
            break
    return out


def _logits_leave(r: RequestResult, ref, upto: int) -> tuple[int, float, float] | None:
    """(position, deviation, tolerance) of the first logits row, up to and including `upto`, that leaves the
    reference's by more than the row's tolerance (the contexts are the same there), or None."""
    if r.logits is None:
        return None
    for p, (row, ref_row) in enumerate(zip(r.logits[: upto + 1], ref.logits)):
        d = logit_deviation(row, ref_row)
        if d > ref.allowed(p):
            return p, d, ref.allowed(p)
    return None


def tolerance_used(run: Run, refs) -> float | None:
    """The largest share of its tolerance (deviation / tolerance) that any logits row the engine recorded uses,
    where its context is the reference's, or None when there is none (1 would be the limit)."""
    found = None
    for r in run.requests:
        ref = refs.get(r.prompt) if refs else None
        if ref is None or r.logits is None:
            continue
        got = _full(r, run.eos_id)
        at = _first_difference(got, ref.token_ids[: r.max_tokens])
        for p, (row, ref_row) in enumerate(zip(r.logits[: (len(got) if at is None else at) + 1], ref.logits)):
            allowed = ref.allowed(p)
            d = logit_deviation(row, ref_row) / allowed if allowed > 0 else float("inf")
            found = d if found is None else max(found, d)
    return found


def matches_reference(run: Run, refs) -> list[Violation]:
    """Greedy tokens equal the dense reference's with the same KV quantization, except at a near tie; and where the
    engine recorded its logits and its tokens agree, every row with the reference's context lies within its
    tolerance (minikv.hunt.logit_tolerance: a shift that flips no token)."""
    out = []
    for r in run.requests:
        ref = refs.get(r.prompt)
        want = ref.token_ids[: r.max_tokens]
        got = _full(r, run.eos_id)
        at = _first_difference(got, want)
        if at is not None and not _near_tie(ref, got, at):
            out.append(Violation("matches-reference", f"request {r.index} (wave {r.wave}) {r.prompt!r} leaves the "
                                                      f"reference {list(want)} (not a near tie)",
                                 f"the engine gave {list(got)}, first different at token {at}",
                                 seen_at=(r.wave, r.index), expected=_as_returned(want, run.eos_id)))
            continue
        left = _logits_leave(r, ref, len(got) if at is None else at)
        if left is not None:
            p, d, allowed = left
            out.append(Violation("matches-reference", f"request {r.index} (wave {r.wave}) {r.prompt!r}: the logits "
                                                      f"before token {p} leave the reference's by more than their "
                                                      f"tolerance", f"by {d:.3g} logits, the tolerance {allowed:.3g}"))
    return out


ORACLES: dict[str, Oracle] = {o.name: o for o in (
    Oracle("runs", "a configuration the engine accepts runs to completion", False, runs),
    Oracle("writes-in-bounds", "every arena byte a step changes lies in a row its slot mapping names "
                               "(guard zones and other requests' blocks untouched)", False, writes_in_bounds),
    Oracle("kernels-match-references", "every kernel call gives its pure-PyTorch reference's result on the same "
                                       "inputs (backends other than torch)", False, kernels_match_references),
    Oracle("repeat-identical", "a batch submitted again after the first one finished, scheduled the same way, "
                               "gives the same tokens and the same KV bytes", False, repeat_identical),
    Oracle("schedule-invariant", "copies of a request give the same tokens whatever the batch geometry, pool "
                                 "size, prefix caching, preemption or arrival time", False, schedule_invariant),
    Oracle("matches-reference", "greedy tokens equal the dense model's with the same KV quantization (a "
                                "quantized cache within its known error), except at a near tie, and each step's "
                                "logits lie within their tolerance of the dense model's", True,
           matches_reference),
)}


def check(run: Run, refs, names=None) -> list[Violation]:
    """Every violation of the named oracles (all by default), in ORACLES order."""
    found = []
    for name, oracle in ORACLES.items():
        if names is None or name in names:
            found += oracle.check(run, refs)
    return found
