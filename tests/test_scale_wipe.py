"""Defect A (scale-wipe): the historical path damages exactly the first batch; the fix damages nothing.

Engine-level tests run the real mechanism (warmup skips KV-sharing layers; their first touch comes mid-forward);
impl-level tests pin the registry's semantics (alias, new storage, dead weak reference, packed storages).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import minikv
from minikv.attention.backend import get_ops
from minikv.attention.impl import AttentionImpl, ScaleFillCensus, release_scale_init, storage_key
from minikv.cache.layout import KVLayout
from minikv.repro import scale_wipe

QUANTIZED = ("int8_per_token_head", "fp8_per_token_head")


def damaged(prompts, texts, reference):
    task = minikv.tasks.for_model("tiny-gemma4")
    return [i for i, (p, t, r) in enumerate(zip(prompts, texts, reference)) if t != r and not task.check(p, t)]


def generate(prompts, max_tokens=8, **kw):
    llm = minikv.LLM(model="tiny-gemma4", **kw)
    outs = llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    llm.arena.check()
    return llm, [o.text for o in outs]


CENSUS = [(0, 0, -1, False), (1, 1, -1, False), (2, 2, -1, False), (3, 3, -1, False),
          (4, 2, 0, True), (5, 3, 0, True), (6, 2, 0, False), (7, 3, 0, False)]


@pytest.mark.parametrize("max_num_seqs", [4, 6, 8])
def test_historical_path_damages_exactly_the_first_batch(max_num_seqs):
    # The defect lives in the engine's Python, which both backends run: the matrix on the torch backend, the
    # Triton kernels below (the reproduction itself, `minikv repro scale-wipe`, runs torch on CPU too).
    fmt = "int8_per_token_head" if max_num_seqs != 6 else "fp8_per_token_head"
    prompts = scale_wipe.make_prompts(2 * max_num_seqs)          # the first batch: distinct prompts
    kw = dict(kv_cache_dtype=fmt, max_num_seqs=max_num_seqs, backend="torch")
    _, clean = generate(prompts, max_tokens=12, **kw)
    llm, buggy = generate(prompts, max_tokens=12, reintroduce=("scale-wipe",), **kw)
    assert damaged(prompts, buggy, clean) == list(range(max_num_seqs))
    assert buggy[max_num_seqs:] == clean[max_num_seqs:]            # later batches clean
    # The census in upstream's shape: the owners (layers 0-3) fill at warmup; per shared storage the first sharer
    # (4 for layer 2's, 5 for layer 3's) wipes at step 0 and the second sharer (6, 7) finds only 1.0s.
    assert [(f.layer, f.storage, f.step, f.overwritten > 0) for f in scale_wipe.census_fills(llm)] == CENSUS


def test_historical_path_through_the_triton_kernels_damages_exactly_the_first_batch():
    max_num_seqs, task = 4, minikv.tasks.for_model("tiny-gemma4")
    prompts = scale_wipe.make_prompts(2 * max_num_seqs)
    llm, buggy = generate(prompts, max_tokens=6, kv_cache_dtype="int8_per_token_head", max_num_seqs=max_num_seqs,
                          backend="triton", reintroduce=("scale-wipe",))
    right = [task.check(p, t) for p, t in zip(prompts, buggy)]
    assert right == [False] * max_num_seqs + [True] * max_num_seqs   # the first batch wrong, the later one right
    assert [(f.layer, f.storage, f.step, f.overwritten > 0) for f in scale_wipe.census_fills(llm)] == CENSUS


def test_census_check_rejects_other_shapes():
    prompts = scale_wipe.make_prompts(8)
    buggy = scale_wipe.run_engine("int8_per_token_head", 4, False, True, prompts, backend="torch", max_tokens=2)
    fixed = scale_wipe.run_engine("int8_per_token_head", 4, False, False, prompts, backend="torch", max_tokens=2)
    assert scale_wipe.check_census(buggy) == [] and scale_wipe.check_census(fixed) == []
    counts = scale_wipe.census_counts(buggy)
    assert counts == {"harmless": 6, "warmup": 4, "late_harmless": 2, "wiping": 2}
    rows = scale_wipe.census_rows(buggy)
    assert [r[:3] for r in rows] == [["layer 2", "sliding", "4, 6"], ["layer 3", "full", "5, 7"],
                                     ["layer 0", "sliding", "-"], ["layer 1", "full", "-"]]
    # The second sharer wiping too, or a sharer that never filled, is not upstream's shape.
    both_wipe = [f if f.layer != 6 else scale_wipe.Fill(6, 2, 0, 10) for f in buggy.fills]
    assert scale_wipe.check_census(dataclasses.replace(buggy, fills=both_wipe))
    assert scale_wipe.check_census(dataclasses.replace(buggy, fills=[f for f in buggy.fills if f.layer != 7]))
    assert scale_wipe.check_census(dataclasses.replace(fixed, fills=buggy.fills))


def test_results_file_has_the_schema_and_one_display_per_quantity():
    path = Path(__file__).resolve().parents[1] / "results" / "scale_wipe.json"
    data = json.loads(path.read_text())
    assert list(data) == ["name", "command", "model", "notebook", "quantities", "tables"]
    assert data["name"] == "scale_wipe" and data["model"] == "tiny-gemma4"
    assert data["command"].startswith("minikv repro scale-wipe") and "--results results/scale_wipe.json" in \
        data["command"]
    for name, q in data["quantities"].items():
        assert set(q) == {"value", "display", "statistic"} and q["statistic"], name
    assert data["quantities"]["k_inflation"]["display"] == f"x{data['quantities']['k_inflation']['value']:.0f}"
    for name, table in data["tables"].items():
        assert set(table) == {"caption", "columns", "rows"}, name
        assert all(len(r) == len(table["columns"]) for r in table["rows"]), name
    assert data["quantities"]["harmless_fills"]["display"] == "6"
    assert data["quantities"]["damaged_requests"]["display"] == "0-3"


def test_quantities_come_from_the_headline_run():
    prompts = scale_wipe.make_prompts(8)
    fixed = scale_wipe.run_engine("int8_per_token_head", 4, False, False, prompts, backend="torch", max_tokens=2)
    buggy = scale_wipe.run_engine("int8_per_token_head", 4, False, True, prompts, backend="torch", max_tokens=2)
    scale_wipe.compare(fixed, buggy)
    q = scale_wipe.quantities([(fixed, buggy)])
    assert q["k_inflation"]["display"] == scale_wipe.times(buggy.k_inflation)
    assert q["wiping_fills"]["display"] == "2" and q["inflation_vs_true_scale"]["display"] == "< 1e-4"
    with pytest.raises(ValueError, match="headline"):
        scale_wipe.quantities([(dataclasses.replace(fixed, max_num_seqs=6), dataclasses.replace(buggy, max_num_seqs=6))])


def test_sixteen_bit_cache_is_untouched_by_the_switch():
    prompts = scale_wipe.make_prompts(6)
    _, clean = generate(prompts, kv_cache_dtype="auto", max_num_seqs=4, backend="torch")
    llm, buggy = generate(prompts, kv_cache_dtype="auto", max_num_seqs=4, backend="torch",
                          reintroduce=("scale-wipe",))
    assert buggy == clean
    assert not llm.census.fills


def test_measured_inflation_equals_one_over_the_true_scale():
    prompts = scale_wipe.make_prompts(8)
    fixed = scale_wipe.run_engine("int8_per_token_head", 4, False, False, prompts, backend="torch", max_tokens=2)
    buggy = scale_wipe.run_engine("int8_per_token_head", 4, False, True, prompts, backend="torch", max_tokens=2)
    scale_wipe.compare(fixed, buggy)
    assert buggy.k_inflation > 5 and buggy.v_inflation > 1
    assert buggy.inflation_error < 1e-4


def prompts_with_residue(residue: int, n: int, block_size: int = 16) -> list[str]:
    task = minikv.tasks.for_model("tiny-gemma4")
    length = 2 * block_size + residue if residue else 3 * block_size
    return task.prompts(n, seed=11 + residue, num_tokens=length)


@pytest.mark.parametrize("fmt", QUANTIZED)
@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("residue", [0, 1, 15])
def test_fixed_path_damages_nothing(fmt, prefix_caching, residue):
    task = minikv.tasks.for_model("tiny-gemma4")
    for max_num_seqs in (4, 6, 8):
        prompts = prompts_with_residue(residue, max_num_seqs + 1)
        if prefix_caching:          # a later request reuses the first request's cached blocks
            prompts[-1] = prompts[0]
        # The torch backend: the defect site is the engine's Python, which both backends run; the triton
        # backend is exercised by the historical-path tests above.
        _, texts = generate(prompts, max_tokens=4, kv_cache_dtype=fmt, max_num_seqs=max_num_seqs,
                            enable_prefix_caching=prefix_caching, backend="torch")
        wrong = [i for i, (p, t) in enumerate(zip(prompts, texts)) if not task.check(p, t)]
        assert wrong == [], f"max_num_seqs={max_num_seqs}"


def kv_bytes_after_prefill(prompts, target: str, **kw) -> dict[str, torch.Tensor]:
    """The cache rows (codes and inline scales) of request `target`, per KV-owning layer, right after its prefill."""
    llm = minikv.LLM(model="tiny-gemma4", **kw)
    rids = {llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=2)): p for p in prompts}
    rows = {}
    while llm.has_unfinished():
        out = llm.step()
        for rid in out.request_ids:
            if out.is_prefill and rids[rid] == target and not rows:
                for pool in out.trace.pools_written():
                    rows[pool] = _slot_rows(llm.arena.layout(pool), llm.arena.pool(pool),
                                            out.block_slots(rid, llm.config.cache.block_size))
    return rows


def _slot_rows(layout: KVLayout, pool: torch.Tensor, slots: list[int]) -> torch.Tensor:
    flat = pool.reshape(-1)
    out = []
    for s in slots:
        b, o = divmod(s, layout.block_size)
        for kv in (0, 1):
            start = layout.row_offset(b, kv, o, 0)
            out.append(flat[start: start + layout.slot_bytes].clone())
    return torch.stack(out)


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_first_and_later_batch_kv_bytes_identical(fmt):
    # The same batch of four runs first in one engine and second in another: only its position in time differs
    # (a different batch composition could change the last bits of a matmul, which is not what is tested here).
    prompts = minikv.tasks.for_model("tiny-gemma4").prompts(8, seed=4)
    x = prompts[0]
    first = kv_bytes_after_prefill(prompts, x, kv_cache_dtype=fmt, max_num_seqs=4, backend="torch")
    later = kv_bytes_after_prefill(prompts[4:] + prompts[:4], x, kv_cache_dtype=fmt, max_num_seqs=4, backend="torch")
    assert first.keys() == later.keys() and first
    for name in first:
        assert torch.equal(first[name], later[name]), name


def scale_regions(llm):
    """{owning layer: (K scales, V scales)} of every scale region of the engine's pools."""
    return {a.layer_name: llm.kv_layout.scale_views(a.kv_cache) for a in llm.attention_layers.values()
            if a.kv_sharing_target is None}


@pytest.mark.parametrize("mode", ["discard", "free"])
def test_sleep_wake_up_reinitializes_every_scale_region(mode):
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=4, backend="torch")
    prompts = scale_wipe.make_prompts(4)
    before = [o.text for o in llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)]
    address = llm.arena.storage.data_ptr()
    fills = len(llm.census.fills)
    llm.sleep(mode=mode)
    llm.wake_up()
    if mode == "discard":
        assert llm.arena.storage.data_ptr() == address           # vLLM's shape: the same address
    assert len(llm.census.fills) == fills + len(scale_regions(llm))   # each region initialized once, at warmup
    for k, v in scale_regions(llm).values():
        assert bool((k == 1).all()) and bool((v == 1).all())
    after = [o.text for o in llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)]
    assert after == before
    assert not llm.census.wiping


def test_same_address_wake_without_reinitialization_leaves_zero_scales_that_nothing_reads():
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=4, backend="torch",
                     repro=minikv.ReproConfig(reinit_scales_on_wake=False))  # a registry keyed by (data_ptr, nbytes) alone
    prompts = scale_wipe.make_prompts(4)
    before = [o.text for o in llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)]
    fills = len(llm.census.fills)
    llm.sleep(mode="discard")
    llm.wake_up()
    assert len(llm.census.fills) == fills                     # nothing re-initialized ...
    for k, v in scale_regions(llm).values():
        assert bool((k == 0).all()) and bool((v == 0).all())  # ... every scale slot is 0, not 1
    after = [o.text for o in llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)]
    assert after == before                                    # minikv's kernels never read an unwritten slot


@pytest.mark.parametrize("mode", ["discard", "free"])
def test_historical_engine_is_not_rearmed_by_wake_up(mode):
    # Upstream's views outlive sleep: the wipe happens in the first batch after engine start, never again.
    prompts = scale_wipe.make_prompts(4)
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=4, backend="torch",
                     reintroduce=("scale-wipe",))
    task = minikv.tasks.for_model("tiny-gemma4")
    first = [o.text for o in llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)]
    assert not any(task.check(p, t) for p, t in zip(prompts, first))
    fills = len(llm.census.fills)
    llm.sleep(mode=mode)
    llm.wake_up()
    again = [o.text for o in llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)]
    assert all(task.check(p, t) for p, t in zip(prompts, again))
    assert len(llm.census.fills) == fills                     # no impl filled anything after the wake-up


def test_arrival_timing_decides_the_damaged_set():
    # Requests arrive over several steps (seeded); the damaged requests are exactly the first scheduled batch,
    # whether it holds one request or several: timing, not the requests, decides who is hit.
    prompts = scale_wipe.make_prompts(8)
    runs = [scale_wipe.arrival_run(prompts, 4, seed, max_tokens=6) for seed in (0, 1)]
    assert [r.first_batch for r in runs] == [[0, 1, 2], [0]]
    for r in runs:
        assert r.damaged == r.first_batch


@pytest.mark.parametrize("fmt", QUANTIZED)
def test_capture_warmup_hides_the_defect(fmt):
    # Same historical code, different warmup: when warmup runs every layer with attention metadata, the sharing
    # layers' first touch (and fill) happens before anything is written, so it wipes nothing.
    prompts = scale_wipe.make_prompts(6)
    _, clean = generate(prompts, kv_cache_dtype=fmt, max_num_seqs=4, backend="torch")
    llm, buggy = generate(prompts, kv_cache_dtype=fmt, max_num_seqs=4, backend="torch",
                          reintroduce=("scale-wipe",), repro=minikv.ReproConfig(warmup="capture"))
    assert buggy == clean
    assert not llm.census.wiping
    assert all(f.step == -1 for f in llm.census.fills)
    assert {f.layer for f in llm.census.fills} == {a.layer_name for a in llm.attention_layers.values()}


# ---- impl level ----------------------------------------------------------------------------------------------------
LAYOUT = KVLayout("int8_per_token_head", torch.float32, 2, 16, 8)


def impl(name, historical=False):
    return AttentionImpl(name, 4, LAYOUT, get_ops("torch"), historical_scale_init=historical)


def write_some(owner: AttentionImpl, pool: torch.Tensor) -> None:
    k = torch.randn(5, 2, 16) * 0.1
    owner.write_cache(pool, k, k.clone(), torch.arange(5))


def new_pool(blocks=4):
    return torch.zeros(blocks, LAYOUT.block_bytes, dtype=torch.uint8)


@pytest.mark.parametrize("historical", [False, True])
def test_second_impl_aliasing_a_storage(historical):
    pool = new_pool()
    owner, sharer = impl("L2", historical), impl("L4", historical)
    write_some(owner, pool)
    written = LAYOUT.scale_views(pool)[0].clone()
    sharer.scale_views(pool)
    k_after = LAYOUT.scale_views(pool)[0]
    if historical:
        assert bool((k_after == 1).all()) and not torch.equal(k_after, written)    # the wipe
        assert sharer.census.fills[-1].overwritten == 20                          # 5 tokens x 2 heads x K, V
    else:
        assert torch.equal(k_after, written)                                      # the fix keeps them


def test_several_sharers_of_one_storage_census_shape():
    # Gemma-4's topology: several sharing layers read one target's storage. Historically the first sharer's fill
    # wipes the written scales and the later sharers' fills find only 1.0s: harmless late fills, as upstream counted.
    pool = new_pool()
    census = ScaleFillCensus()
    owner, *sharers = (AttentionImpl(n, 4, LAYOUT, get_ops("torch"), historical_scale_init=True, census=census)
                       for n in ("L2", "L4", "L6"))
    write_some(owner, pool)
    for s in sharers:
        s.scale_views(pool)
    assert [f.overwritten for f in census.fills] == [0, 20, 0]


def test_new_storage_is_initialized():
    a, b = new_pool(), new_pool()
    impl("L0").scale_views(a)
    impl("L1").scale_views(b)
    for pool in (a, b):
        k, v = LAYOUT.scale_views(pool)
        assert bool((k == 1).all()) and bool((v == 1).all())


def test_two_views_of_one_storage_count_once():
    # The owner registers through one view object, which then dies; the sharer touches another view object of the
    # same live storage. A registry holding a weak reference to the *tensor* would see a dead reference and fill
    # again (wiping the written scales); keyed on the storage, it must not.
    base = new_pool(4)
    owner, sharer = impl("L2"), impl("L4")
    first_view = base.view(4, LAYOUT.block_bytes)
    write_some(owner, first_view)
    written = LAYOUT.scale_views(base)[0].clone()
    del first_view
    second_view = base[:]
    assert second_view is not base and storage_key(second_view) == storage_key(base)
    sharer.scale_views(second_view)
    assert torch.equal(LAYOUT.scale_views(base)[0], written)
    assert len(owner.census.fills) == 1 and not sharer.census.fills


def test_freed_and_reused_address_is_initialized_again():
    # Two torch storages over one buffer, one after the other: the second is a new allocation at the old address
    # with the old size, so (data_ptr, nbytes) repeats; only the weak reference to the storage tells them apart.
    buffer = bytearray(4 * LAYOUT.block_bytes)
    old = torch.frombuffer(buffer, dtype=torch.uint8)
    impl("L0").scale_views(old)
    key = storage_key(old)
    LAYOUT.scale_views(old)[0].fill_(0.25)                    # stale bytes left by the previous owner
    del old                                                   # the storage dies (its registry reference with it)
    reused = torch.frombuffer(buffer, dtype=torch.uint8)
    assert storage_key(reused) == key
    newcomer = impl("L0-again")
    newcomer.scale_views(reused)
    assert len(newcomer.census.fills) == 1
    assert bool((LAYOUT.scale_views(reused)[0] == 1).all())


def test_released_storage_is_initialized_again_at_the_same_address():
    pool = new_pool()
    impl("L0").scale_views(pool)
    LAYOUT.scale_views(pool)[0].zero_()                       # contents discarded, storage and address kept
    later = impl("L0-after-wake")
    later.scale_views(pool)
    assert not later.census.fills                             # same storage, same key: nothing says "discarded"
    release_scale_init(pool)
    later.scale_views(pool)
    assert len(later.census.fills) == 1 and bool((LAYOUT.scale_views(pool)[0] == 1).all())


def test_historical_site_fills_once_per_impl_then_returns_early_for_good():
    owner = impl("L0", historical=True)
    first, second = new_pool(), new_pool()
    owner.scale_views(first)
    owner.scale_views(second)                                 # a different tensor and storage: still no fill
    assert len(owner.census.fills) == 1
    assert bool((LAYOUT.scale_views(second)[0] == 0).all())


def test_two_layers_packed_in_one_storage_each_initialize_their_region():
    base = new_pool(8)
    first, second = base[:4], base[4:]
    impl("L0").scale_views(first)
    assert bool((LAYOUT.scale_views(second)[0] == 0).all())    # the neighbour's region is left alone
    impl("L1").scale_views(second)
    assert bool((LAYOUT.scale_views(second)[0] == 1).all())


def test_two_engines_in_one_process_share_the_class_level_registry_without_colliding():
    """The fix's registry is class-level (upstream's shape): two live engines register disjoint storages, and
    each serves exactly what one engine alone serves."""
    prompts = scale_wipe.make_prompts(4)
    params = minikv.SamplingParams(temperature=0, max_tokens=6)

    def build():
        return minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=4, backend="torch")

    alone = [o.token_ids for o in build().generate(prompts, params, use_tqdm=False)]
    a, b = build(), build()

    def keys(llm):
        return {storage_key(binding.kv_cache) for binding in llm.attention_layers.values()}

    assert keys(a).isdisjoint(keys(b))
    assert keys(a) | keys(b) <= set(AttentionImpl._initialized_storages)
    served = [[o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)] for llm in (a, b)]
    assert served == [alone, alone]


def test_prefix_caching_carries_the_wipe_only_to_copies_that_find_wiped_blocks_still_cached():
    """The rule the docs state: with prefix caching on, a request is damaged when it ran in the first step or found
    a wiped block in the prefix cache. With the 32-block pool of max_num_seqs=4 the copies come after eviction."""
    prompts = scale_wipe.make_prompts(24, copies=2)
    small = scale_wipe.prefix_reuse(prompts, 4, backend="torch")
    assert small.predicted == small.damaged == [0, 1, 2, 3]
    assert all(r.found == 0 and r.evictions > 0 and r.full_blocks > 0 for r in small.requests[12:16])
    large = scale_wipe.prefix_reuse(prompts, 8, backend="torch")
    assert large.predicted == large.damaged and set(range(8)) < set(large.damaged)
    assert all(r.evictions == 0 for r in large.requests)
    assert [r.request for r in large.requests[12:] if r.found_wiped] == [r for r in large.damaged if r >= 12]
