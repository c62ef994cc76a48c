"""Defects the hunter was not written for, planted by wrapping the engine's kernel ops (`llm.kernel_ops`, through
minikv.hunt.seams): the hunter finds each one with the same search it runs on the historical defects.

- `last_scale_to_wrong_slot`: the cache writer puts the last token's scale into the neighbouring slot;
- `skip_scale_write_in_last_pool`: the engine's last KV pool (its last layer's) gets its codes, never its scales.
"""
from __future__ import annotations

import os

import pytest

from minikv.hunt import hunt
from minikv.hunt.reference import DenseReference
from minikv.hunt.seams import pool_of, wrap_kernel_op


def last_scale_to_wrong_slot(llm):
    def make(write_kv):
        def planted(key, value, pool, slot_mapping, spec, *args, **kwargs):
            write_kv(key, value, pool, slot_mapping, spec, *args, **kwargs)
            _, layout = pool_of(llm, pool)
            slots = slot_mapping[slot_mapping >= 0]
            if not layout.has_inline_scales or not len(slots):
                return
            last, bs = int(slots[-1]), layout.block_size
            wrong = last + 1 if (last + 1) % bs else last - 1
            for scales in layout.scale_views(pool):
                scales[wrong // bs, wrong % bs] = scales[last // bs, last % bs]
                scales[last // bs, last % bs] = 1.0
        return planted
    wrap_kernel_op(llm, "write_kv", make)


def skip_scale_write_in_last_pool(llm):
    last = list(llm.arena.offsets)[-1]

    def make(write_kv):
        def planted(key, value, pool, slot_mapping, spec, *args, **kwargs):
            name, layout = pool_of(llm, pool)
            if name != last or not layout.has_inline_scales:
                return write_kv(key, value, pool, slot_mapping, spec, *args, **kwargs)
            kept = [s.clone() for s in layout.scale_views(pool)]
            write_kv(key, value, pool, slot_mapping, spec, *args, **kwargs)
            for scales, old in zip(layout.scale_views(pool), kept):
                scales.copy_(old)
        return planted
    wrap_kernel_op(llm, "write_kv", make)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    path = tmp_path_factory.mktemp("hunt_planted")
    before = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(before)


@pytest.mark.parametrize("plant, invariants", [
    (last_scale_to_wrong_slot, {"writes-in-bounds", "matches-reference"}),
    (skip_scale_write_in_last_pool, {"matches-reference"}),
])
def test_a_planted_defect_is_found(scratch, plant, invariants):
    report = hunt(instrument=plant, max_scenarios=48, budget_s=None, reference=DenseReference(), progress=False)
    assert report.found, report.text()
    assert {v.oracle for v in report.finding.violations} == invariants
    assert f"{plant.__qualname__}(llm)" in report.finding.snippet      # the reproduction plants it too
    assert report.finding.scenario.kv_cache_dtype.endswith("_per_token_head")
    assert list(scratch.iterdir()) == []


def attention_off_by_a_hair(llm):
    """Every attention output 0.2% too large: attention shifts, but no greedy token of the shipped models flips."""
    for op in ("context", "paged_context", "decode"):
        wrap_kernel_op(llm, op, lambda kernel: lambda *args, **kwargs: kernel(*args, **kwargs) * 1.002)


def test_a_shift_no_token_shows_is_found_by_the_logits(scratch, monkeypatch):
    """matches-reference compares each step's logits with the dense model's, within each row's tolerance
    (minikv.hunt.logit_tolerance): tight on float32 cells, so a defect that changes no token is still found."""
    from minikv.hunt import oracles
    reference = DenseReference()
    report = hunt(instrument=attention_off_by_a_hair, max_scenarios=24, budget_s=None, reference=reference,
                  progress=False)
    assert report.found, report.text()
    v = report.finding.violations[0]
    assert v.oracle == "matches-reference" and "logits before token" in v.summary, report.text()
    assert report.finding.scenario.dtype == "float32"
    # without the logits check, the same scenarios up to it find nothing
    monkeypatch.setattr(oracles, "_logits_leave", lambda *args: None)
    blind = hunt(instrument=attention_off_by_a_hair, max_scenarios=report.finding.scenarios_before + 1,
                 budget_s=None, reference=reference, progress=False)
    assert not blind.found, blind.text()
