"""One number per quantity, and the JSON results file: what README, docs and notebook 03 quote, computed once
(`quantities`, `results`). See docs/internals.md#repro-scale-wipe-report."""
from __future__ import annotations

from minikv.repro.common import ranges

from .census import CENSUS_COLUMNS, UPSTREAM_CENSUS, UPSTREAM_INFLATION, census_counts, census_rows, times
from .run import NOTEBOOK, Run, compare

# ---- one number per quantity: what README, docs and notebook 03 quote, from one computation ------------------
HEADLINE = ("int8_per_token_head", 4, False)    # (format, max_num_seqs, prefix caching) the quantities are taken at
INFLATION_STATISTIC = ("median over the first batch's (token, kv head) {part} rows in the shared storages ({storages}) "
                       "of |{part}_buggy| / |{part}_fixed| (vector norms) right after step 0; "
                       "int8_per_token_head, max_num_seqs=4, prefix caching off")


def shared_storages(run: Run) -> str:
    """'layers 2 and 3': the storages KV-sharing layers read."""
    owners = sorted(set(run.sharing.values()))
    return "layer" + ("s " if len(owners) > 1 else " ") + " and ".join(map(str, owners))


def headline_pair(pairs: list[tuple[Run, Run]]) -> tuple[Run, Run]:
    """The (fixed, buggy) pair of the HEADLINE configuration."""
    for fixed, buggy in pairs:
        if (buggy.kv_cache_dtype, buggy.max_num_seqs, buggy.prefix_caching) == HEADLINE:
            return fixed, buggy
    raise ValueError(f"no run of the headline configuration {HEADLINE} among the pairs")


def quantities(pairs: list[tuple[Run, Run]]) -> dict[str, dict]:
    """{name: {"value", "display", "statistic"}} of the single figures quoted in prose, from the HEADLINE
    pair."""
    _, buggy = headline_pair(pairs)
    counts = census_counts(buggy)
    wiped = [f.overwritten for f in buggy.fills if f.overwritten]
    law = buggy.inflation_error
    where = shared_storages(buggy)
    how = ("answered wrongly and differently from the fixed engine" if buggy.judge == "task" else
           "answered with other token ids than the fixed engine (random weights: no answer is right)")
    out = {
        "k_inflation": {"value": round(buggy.k_inflation, 1), "display": times(buggy.k_inflation),
                        "statistic": INFLATION_STATISTIC.format(part="K", storages=where)},
        "v_inflation": {"value": round(buggy.v_inflation, 1), "display": times(buggy.v_inflation),
                        "statistic": INFLATION_STATISTIC.format(part="V", storages=where)},
        "inflation_vs_true_scale": {
            "value": float(f"{law:.1g}"), "display": "< 1e-4" if law < 1e-4 else f"{law:.0e}",
            "statistic": "max over the same K rows of |(|K_buggy| / |K_fixed|) x true scale - 1|"},
        "damaged_requests": {"value": buggy.damaged, "display": ranges(buggy.damaged),
                             "statistic": f"requests (of {len(buggy.texts)}) the buggy engine {how}; "
                                          "int8_per_token_head, max_num_seqs=4"},
        "harmless_fills": {"value": counts["harmless"], "display": str(counts["harmless"]),
                           "statistic": "scale fills of the buggy engine that overwrote no written scale"},
        "wiping_fills": {"value": counts["wiping"], "display": str(counts["wiping"]),
                         "statistic": "late scale fills of the buggy engine that overwrote written scales"},
        "wiped_scales": {"value": wiped, "display": " and ".join(f"{n:,}" for n in wiped) or "none",
                         "statistic": "written scales (K and V) each wiping fill overwrote"},
    }
    if buggy.judge != "task":
        del out["damaged_requests"]
    return out


def damage_rows(pairs: list[tuple[Run, Run]], clean16=None) -> list[list]:
    rows = []
    for fixed, buggy in pairs:
        n = census_counts(buggy)
        rows.append([buggy.kv_cache_dtype, buggy.max_num_seqs, "on" if buggy.prefix_caching else "off",
                     ranges(buggy.damaged), ranges(fixed.damaged), times(buggy.k_inflation),
                     times(buggy.v_inflation), n["harmless"], n["wiping"]])
    if clean16 is not None:
        fixed, buggy = clean16
        same = fixed.texts == buggy.texts
        compare(fixed, buggy)
        rows.append(["auto", buggy.max_num_seqs, "off",
                     "none" if same else "OUTPUTS DIFFER", ranges(fixed.damaged),
                     "-", "-", len(buggy.fills), 0])
    return rows


DAMAGE_COLUMNS = ["kv_cache_dtype", "max_num_seqs", "prefix caching", "damaged (buggy)", "damaged (fixed)",
                  "K inflation", "V inflation", "fills that wiped nothing", "late fills that wiped"]


def upstream_rows(pairs: list[tuple[Run, Run]]) -> list[list]:
    """[quantity, minikv, upstream] for the census and the inflation (upstream: the vLLM fix's description)."""
    q = quantities(pairs)
    up = UPSTREAM_CENSUS
    return [["fills that wiped nothing", q["harmless_fills"]["display"], str(up["harmless"])],
            ["late fills that wiped written scales", q["wiping_fills"]["display"], str(up["wiping"])],
            ["written scales each wiping fill overwrote", q["wiped_scales"]["display"],
             f"{up['wiped'][0]:,} and {up['wiped'][1]:,}"],
            ["K inflation (= 1 / true scale)", q["k_inflation"]["display"], times(UPSTREAM_INFLATION["K"])],
            ["V inflation (= 1 / true scale)", q["v_inflation"]["display"], times(UPSTREAM_INFLATION["V"])]]


def results(pairs: list[tuple[Run, Run]], clean16, command: str, name: str = "scale_wipe",
            extra_tables: dict | None = None) -> dict:
    """The results file's content (RESULTS_SCHEMA: name, command, model, quantities, tables); `extra_tables`
    (the warmup-shape census, the prefix-caching orders) are added after the standard ones."""
    _, buggy = headline_pair(pairs)
    n = len(buggy.texts)
    return {
        "name": name,
        "command": command,
        "model": buggy.model,
        "notebook": NOTEBOOK,
        "quantities": quantities(pairs),
        "tables": {
            "damage": {"caption": f"Damaged requests per configuration ({n} requests: {n // 2} prompts x 2), buggy "
                                  "and fixed engines; inflation: median per (token, kv head) row of the first batch",
                       "columns": DAMAGE_COLUMNS, "rows": damage_rows(pairs, clean16)},
            "census": {"caption": f"Scale fills per storage, buggy engine ({buggy.kv_cache_dtype}, max_num_seqs="
                                  f"{buggy.max_num_seqs}); each fill: layer, when, written scales overwritten",
                       "columns": CENSUS_COLUMNS, "rows": census_rows(buggy)},
            "census_vs_upstream": {"caption": "minikv's census and inflation next to upstream's (gemma-4-E2B-it, "
                                              "from vLLM pull request #51061)",
                                   "columns": ["quantity", f"minikv ({buggy.model})", "upstream (gemma-4-E2B-it)"],
                                   "rows": upstream_rows(pairs)},
            **(extra_tables or {}),
        },
    }


def format_quantities(pairs: list[tuple[Run, Run]]) -> str:
    """One line per quantity: name, display, statistic (what notebook 03 and the repro print)."""
    return "\n".join(f"{name:24s} {q['display']:14s} {q['statistic']}" for name, q in quantities(pairs).items())
