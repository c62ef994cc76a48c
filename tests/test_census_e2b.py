"""Upstream's census from gemma-4-E2B's topology, the "(pre-write)" question, and prefix caching by copy order.

* tiny-gemma4-e2b's buggy engine makes 33 fills that wipe nothing and 2 that wipe (layers 15 and 19, the first
  sharers of layer 13's sliding and layer 14's full storage), from the real mechanism, and damages exactly the
  first batch; per warmup shape: the dummy warmup's 33 are 15 fills before any write + 18 after the owner's
  write with nothing left to wipe, a capture-shaped warmup wipes nothing, and only a hand-picked warmup of the 18
  later sharers makes all 33 precede the first write with the same 2 wiping;
* with prefix caching on (tiny-gemma4), prompts without a full block give exactly the first batch in either order
  of the copies, and full-block prompts carry the damage to copies that reuse the wiped blocks.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from minikv.repro import scale_wipe


def test_e2b_census_and_warmup_shapes():
    torch.set_num_threads(1)
    prompts = scale_wipe.make_prompts(4, model=scale_wipe.E2B_MODEL)
    rows = {r.case: r for r in scale_wipe.warmup_census(prompts, 2, model=scale_wipe.E2B_MODEL, max_tokens=1,
                                                          damage="attention")}
    dummy, capture, picked = rows["dummy"], rows["capture"], rows["later sharers"]
    assert dummy.pre_write == list(range(15))                            # the 15 owners, at warmup
    assert len(dummy.post_write_harmless) == 18 and dummy.wiping == [15, 19]
    assert len(dummy.pre_write) + len(dummy.post_write_harmless) == scale_wipe.UPSTREAM_CENSUS["harmless"] == 33
    assert len(dummy.wiping) == scale_wipe.UPSTREAM_CENSUS["wiping"] and dummy.damaged == [0, 1]
    assert len(capture.pre_write) == 35 and not capture.wiping and not capture.damaged
    assert len(picked.pre_write) == 33 and not picked.post_write_harmless and picked.wiping == [15, 19]
    assert picked.damaged == dummy.damaged
    assert scale_wipe.check_warmup_census(list(rows.values()), 2) == []


def test_prefix_caching_by_copy_order_and_prompt_length():
    runs = scale_wipe.prefix_caching_runs(max_num_seqs=(4, 6))
    assert scale_wipe.check_prefix_runs(runs) == []
    by = {(r.order, r.prompt_set, r.max_num_seqs): r.damaged for r in runs}
    assert by[("after", "full blocks", 4)] == [0, 1, 2, 3, 6, 7, 8, 9, 12, 13, 14, 15, 18, 19, 20, 21]
    assert by[("adjacent", "full blocks", 6)] == list(range(8))          # the split prompt's later copies
    assert all(by[(o, "no full block", n)] == list(range(n)) for o in ("after", "adjacent") for n in (4, 6))


def test_e2b_results_file():
    path = Path(__file__).resolve().parents[1] / "results" / "scale_wipe_e2b.json"
    data = json.loads(path.read_text())
    assert data["name"] == "scale_wipe_e2b" and data["model"] == scale_wipe.E2B_MODEL
    q = data["quantities"]
    assert (q["harmless_fills"]["display"], q["wiping_fills"]["display"]) == ("33", "2")
    damage = {(r[0], r[1], r[2]): r[3] for r in data["tables"]["damage"]["rows"]}     # format, seqs, prefix caching
    assert [damage[("int8_per_token_head", n, "off")] for n in (4, 6, 8)] == ["0-3", "0-5", "0-7"]
    assert {"warmup_census", "prefix_caching_orders", "census"} <= set(data["tables"])
