"""The census of defect A's scale fills, per shared storage, against upstream's (33 harmless, 2 that wipe),
and the main table of damaged requests with the signatures it must show (`check_signatures`).
See docs/internals.md#repro-scale-wipe-census."""
from __future__ import annotations

from dataclasses import dataclass

from minikv.repro.common import ranges

from .run import Fill, Run, compare

# Upstream's census on gemma-4-E2B-it (the description of vLLM pull request #51061, minikv/defects/provenance.py): fills that
# wiped nothing, and the written scales each late wiping fill overwrote. It does not break the harmless fills down further.
UPSTREAM_CENSUS = {"harmless": 33, "wiping": 2, "wiped": (22_384, 13_394)}
UPSTREAM_INFLATION = {"K": 221, "V": 24}


@dataclass
class StorageCensus:
    """The fills one storage received: its owner's, then its sharers' in the order they touched it."""

    storage: int                 # the owning layer
    layer_type: str
    sharers: list[int]
    fills: list[Fill]

    @property
    def wiping(self) -> list[Fill]:
        return [f for f in self.fills if f.overwritten]

    @property
    def harmless(self) -> list[Fill]:
        return [f for f in self.fills if not f.overwritten]


def census_by_storage(run: Run) -> list[StorageCensus]:
    """Group a run's census by storage; shared storages first (in owner order), then the unshared ones."""
    owners = sorted({f.storage for f in run.fills} | set(run.sharing.values()))
    out = []
    for owner in owners:
        sharers = sorted(layer for layer, target in run.sharing.items() if target == owner)
        kind = run.layer_types[owner] if owner < len(run.layer_types) else "?"
        out.append(StorageCensus(owner, kind, sharers, [f for f in run.fills if f.storage == owner]))
    return sorted(out, key=lambda c: (not c.sharers, c.storage))


def census_counts(run: Run) -> dict[str, int]:
    """{"harmless": fills that wiped nothing, "warmup": of those, the warmup ones, "late_harmless": the late ones,
    "wiping": late fills that wiped written scales}."""
    warmup = sum(1 for f in run.fills if f.step < 0 and not f.overwritten)
    late_harmless = sum(1 for f in run.fills if f.step >= 0 and not f.overwritten)
    return {"harmless": warmup + late_harmless, "warmup": warmup, "late_harmless": late_harmless,
            "wiping": sum(1 for f in run.fills if f.overwritten)}


def _fill_text(fills: list[Fill]) -> str:
    """'layer 6 step 0: 0'; several fills at one step that overwrote the same count: 'layers 16-18, 20 step 0: 0
    each'."""
    if not fills:
        return "-"
    groups: dict[tuple[int, int], list[int]] = {}
    for f in fills:
        groups.setdefault((f.step, f.overwritten), []).append(f.layer)
    parts = []
    for (step, overwritten), layers in groups.items():
        when = "warmup" if step < 0 else f"step {step}"
        if len(layers) == 1:
            parts.append(f"layer {layers[0]} {when}: {overwritten:,}")
        else:
            parts.append(f"layers {ranges(layers)} {when}: {overwritten:,} each")
    return ", ".join(parts)


def census_rows(run: Run) -> list[list]:
    """[storage, layer type, sharers, owner's fill, the wiping late fill, harmless late fills] per storage."""
    rows = []
    for c in census_by_storage(run):
        own = [f for f in c.fills if f.layer == c.storage]
        late = [f for f in c.fills if f.layer != c.storage]
        rows.append([f"layer {c.storage}", c.layer_type, ", ".join(map(str, c.sharers)) or "-", _fill_text(own),
                     _fill_text([f for f in late if f.overwritten]), _fill_text([f for f in late if not f.overwritten])])
    return rows


CENSUS_COLUMNS = ["storage of", "type", "read by", "owner's fill", "late fill that wipes", "harmless late fills"]


def format_census(run: Run) -> str:
    """The census of one run per storage (fills as `layer, when: written scales overwritten`), then its totals next
    to upstream's."""
    rows = [CENSUS_COLUMNS] + census_rows(run)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(CENSUS_COLUMNS))]
    lines = ["  ".join(f"{c!s:{w}s}" for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    n = census_counts(run)
    wiped = " and ".join(f"{f.overwritten:,}" for f in run.fills if f.overwritten)
    up = UPSTREAM_CENSUS
    ours = f"{n['wiping']} late fills wiped {wiped} written scales" if wiped else "no fill wiped a written scale"
    lines += ["",
              (f"minikv   ({run.model}): {n['harmless']} fills wiped nothing ({n['warmup']} warmup fills of the owning "
               f"layers + {n['late_harmless']} late fills of later sharers); {ours}"),
              (f"upstream (gemma-4-E2B-it): {up['harmless']} fills wiped nothing; {up['wiping']} late fills wiped "
               f"{up['wiped'][0]:,} and {up['wiped'][1]:,} written scales")]
    return "\n".join(lines)


def check_census(run: Run) -> list[str]:
    """Whether the census has upstream's shape per shared storage."""
    tag = f"{'buggy' if run.buggy else 'fixed'} {run.kv_cache_dtype} max_num_seqs={run.max_num_seqs}"
    problems = []
    for c in census_by_storage(run):
        own = [f for f in c.fills if f.layer == c.storage]
        if [(f.step, f.overwritten) for f in own] != [(-1, 0)]:
            problems.append(f"{tag}: storage of layer {c.storage}: owner's fills {own}, expected one at warmup")
        late = [f for f in c.fills if f.layer != c.storage]
        if not run.buggy:
            if late:
                problems.append(f"{tag}: storage of layer {c.storage}: late fills {late} in the fixed engine")
            continue
        if [f.layer for f in late] != c.sharers or any(f.step != 0 for f in late):
            problems.append(f"{tag}: storage of layer {c.storage}: late fills by {[f.layer for f in late]}, "
                            f"expected one per sharer {c.sharers} at step 0")
        elif late and (not late[0].overwritten or any(f.overwritten for f in late[1:])):
            problems.append(f"{tag}: storage of layer {c.storage}: expected the first sharer's fill to wipe and the "
                            f"others to be harmless, got {[f.overwritten for f in late]}")
    return problems


def times(factor: float) -> str:
    """An inflation factor as the prose quotes it: whole factors ("x46")."""
    return f"x{factor:.0f}"


def check_signatures(pairs: list[tuple[Run, Run]], clean16: tuple[Run, Run] | None) -> list[str]:
    """Return the list of signatures that did NOT hold (empty = reproduction faithful)."""
    problems = []
    for fixed, buggy in pairs:
        tag = f"{buggy.kv_cache_dtype} max_num_seqs={buggy.max_num_seqs} prefix_caching={buggy.prefix_caching}"
        first = list(range(buggy.max_num_seqs))
        if fixed.damaged:
            problems.append(f"fixed {tag}: damaged {ranges(fixed.damaged)}")
        if not buggy.prefix_caching and buggy.damaged != first:
            problems.append(f"buggy {tag}: damaged {ranges(buggy.damaged)}, expected exactly {ranges(first)}")
        if buggy.prefix_caching and not set(first) <= set(buggy.damaged):
            problems.append(f"buggy {tag}: first batch not all damaged ({ranges(buggy.damaged)})")
        if not buggy.late_fills:
            problems.append(f"buggy {tag}: no late fill wiped written scales")
        if fixed.late_fills:
            problems.append(f"fixed {tag}: a fill wiped written scales")
        problems += check_census(fixed) + check_census(buggy)
        if not buggy.inflation_error < 1e-4:
            problems.append(f"buggy {tag}: inflation differs from 1/true scale by {buggy.inflation_error:.3g}")
    if clean16 is not None:
        fixed, buggy = clean16
        if buggy.texts != fixed.texts:
            problems.append("a 16-bit cache changed its outputs under the scale-wipe switch")
    return problems


def format_table(pairs: list[tuple[Run, Run]], clean16) -> str:
    head = (f"{'kv_cache_dtype':22s} {'seqs':>4s} {'prefix':>6s} {'version':7s} {'damaged requests':18s} "
            f"{'K infl':>8s} {'V infl':>8s}  fills (harmless | late: wiped scales)")
    lines = [head, "-" * len(head)]
    for fixed, buggy in pairs:
        for r in (buggy, fixed):
            late = ", ".join(f"{layer}: {n:,}" for layer, n in r.late_fills) or "-"
            infl_k = times(r.k_inflation) if r.buggy and r.k_inflation == r.k_inflation else "-"
            infl_v = times(r.v_inflation) if r.buggy and r.v_inflation == r.v_inflation else "-"
            lines.append(f"{r.kv_cache_dtype:22s} {r.max_num_seqs:4d} {('on' if r.prefix_caching else 'off'):>6s} "
                         f"{('buggy' if r.buggy else 'fixed'):7s} {ranges(r.damaged):18s} {infl_k:>8s} {infl_v:>8s}  "
                         f"{r.harmless_fills} | {late}")
    if clean16 is not None:
        fixed, buggy = clean16
        same = "identical outputs" if fixed.texts == buggy.texts else "OUTPUTS DIFFER"
        compare(fixed, buggy)
        lines.append(f"{'auto (16/32-bit)':22s} {buggy.max_num_seqs:4d} {'off':>6s} {'buggy':7s} "
                     f"{ranges(buggy.damaged):18s} {'-':>8s} {'-':>8s}  "
                     f"no inline scales: {same} to the fixed engine")
    return "\n".join(lines)


def code_site_diff(context: int = 3) -> str:
    """Defect A's code site as a unified diff, HISTORICAL -> FIX, made from the source of the two versions."""
    import difflib
    import inspect

    from minikv.attention.impl import AttentionImpl
    old = inspect.getsource(AttentionImpl._scale_views_historical).splitlines()
    new = inspect.getsource(AttentionImpl._scale_views_once_per_storage).splitlines()
    return "\n".join(difflib.unified_diff(old, new, "HISTORICAL  minikv/attention/impl.py",
                                           "FIX         minikv/attention/impl.py", lineterm="", n=context))
