"""Defects B1 (cross-stride) and B2 (cross-fp8-context-read) on tiny-t5 (three cross layers, run as a 16-bit model):
the regression tests upstream's reviewers asked for, the layout contract, both construction orders, the fixed fp8
path equal to `auto`, and the results file's quantities."""
from __future__ import annotations

import logging
import math

import pytest
import torch

import minikv
from minikv.attention.cross import B1_SITES, CrossAttentionModule, CrossBackendBuilder, QuantConfig
from minikv.cli import main
from minikv.repro import cross_stride

TASK = minikv.tasks.for_model(cross_stride.MODEL)


def cross_layers(llm):
    return [a for a in llm.attention_layers.values() if a.kind == "cross"]


@pytest.fixture(scope="module")
def prompts():
    return cross_stride.make_prompts(4, seed=2)


@pytest.fixture(scope="module")
def reference(prompts):
    return cross_stride.reference_tokens(prompts, backend="torch")


def test_fixed_fp8_equals_auto_and_is_right(prompts, reference):
    llm = cross_stride.engine("fp8", max_num_seqs=4, backend="torch")
    outs = llm.generate(prompts, [minikv.SamplingParams(temperature=0, max_tokens=TASK.max_tokens(p)) for p in prompts],
                        use_tqdm=False)
    assert [o.token_ids for o in outs] == reference
    assert all(TASK.check(p, o.text) for p, o in zip(prompts, outs))


def test_pool_holding_the_blocks_but_less_than_twice_fails_buggy_and_passes_fixed(prompts, reference):
    need = cross_stride.engine("fp8", backend="torch").cross_blocks_needed(prompts)
    blocks = math.floor(1.5 * need)
    assert need <= blocks < 2 * need
    buggy = cross_stride.run_pool(prompts, reference, 1.5, need, buggy=True, sanitize=True, backend="torch")
    assert buggy.outcome == "overrun caught" and "cross." in buggy.detail
    silent = cross_stride.run_pool(prompts, reference, 1.5, need, buggy=True, sanitize=False, backend="torch")
    assert silent.outcome == "wrong tokens"            # never a crash: the overrun stayed inside the arena
    fixed = cross_stride.run_pool(prompts, reference, 1.5, need, buggy=False, sanitize=True, backend="torch")
    assert fixed.outcome == "correct"


def test_twice_the_blocks_hides_the_historical_stride(prompts, reference):
    need = cross_stride.engine("fp8", backend="torch").cross_blocks_needed(prompts)
    assert cross_stride.run_pool(prompts, reference, 2.0, need, buggy=True, sanitize=True,
                                 backend="torch").outcome == "correct"


def test_a_float32_model_needs_four_times_the_blocks():
    """The historical backend addresses the pool at the model's element size: 4 bytes for float32, so 2x is not
    enough and 4x is (B2 cannot happen there: float32 always takes the unfused context path)."""
    prompts = cross_stride.make_prompts(3, seed=1)
    reference = cross_stride.reference_tokens(prompts, backend="torch")
    need = cross_stride.engine("fp8", backend="torch").cross_blocks_needed(prompts)
    outcomes = {}
    for factor in (2.0, 3.99, 4.0):
        blocks = math.floor(factor * need)
        llm = cross_stride.engine("fp8", backend="torch", dtype=torch.float32, max_num_seqs=3,
                                  repro=minikv.ReproConfig(check_layout=False),
                                  cross_pool_blocks=blocks, reintroduce=("cross-stride",))
        try:
            outcomes[factor] = cross_stride.generate_tokens(llm, prompts) == reference
        except minikv.KVCacheOverrunError:
            outcomes[factor] = "overrun"
    assert outcomes == {2.0: "overrun", 3.99: "overrun", 4.0: True}


def test_overrun_of_every_cross_layer_lands_in_the_next_pool():
    facts = cross_stride.overrun_facts(1.5, 10)
    names = [f.pool for f in facts]
    assert len(names) == 3 and all(n.startswith("cross.") for n in names)
    assert [f.lands_in for f in facts] == names[1:] + ["kv.decoder.0.self_attn"]
    assert len({f.bytes_past_end for f in facts}) == 1 and facts[0].bytes_past_end == 20 * 4096 - 15 * 4096
    assert all(f.bytes_past_end == 0 for f in cross_stride.overrun_facts(2.0, 10))


def test_same_request_twice_through_the_engine_gives_the_same_output(prompts):
    llm = cross_stride.engine("fp8", max_num_seqs=4, backend="torch")
    p = [prompts[0]] * 3
    params = minikv.SamplingParams(temperature=0, max_tokens=TASK.max_tokens(prompts[0]))
    together = [o.token_ids for o in llm.generate(p, params, use_tqdm=False)]
    again = llm.generate(prompts[0], params, use_tqdm=False)[0].token_ids
    assert together[0] == together[1] == together[2] == again


@pytest.mark.parametrize("order", ["eager", "deferred"])
def test_cross_backend_layout_in_both_construction_orders(order):
    fixed = CrossBackendBuilder("fp8", torch.float16, 16, historical=False).build(order, 2, 32)
    buggy = CrossBackendBuilder("fp8", torch.float16, 16, historical=True).build(order, 2, 32)
    assert fixed.elem_bytes == 1 and buggy.elem_bytes == 2
    llm = cross_stride.engine("fp8", repro=minikv.ReproConfig(cross_construction=order), max_num_seqs=2,
                              backend="torch")
    # The engine bound its cross backends with the layout contract on: their layouts equal the fp8 pools'.
    assert llm.config.repro.check_layout
    assert all(llm.arena.layout(n).elem_bytes == 1 for n in llm.arena.offsets if n.startswith("cross."))
    assert all(a.impl.layout.elem_bytes == 1 for a in cross_layers(llm))


@pytest.mark.parametrize("fixed_site, broken_order", [("construction", "deferred"), ("create_weights", "eager")])
def test_a_half_fix_leaves_the_other_construction_order_broken(fixed_site, broken_order):
    historical = frozenset(B1_SITES) - {fixed_site}
    builder = CrossBackendBuilder("fp8", torch.float16, 16, historical=False, historical_sites=historical)
    other = "eager" if broken_order == "deferred" else "deferred"
    assert builder.build(other, 2, 32).elem_bytes == 1
    assert builder.build(broken_order, 2, 32).elem_bytes == 2


def test_the_two_orders_reach_the_backend_by_different_calls():
    eager = CrossBackendBuilder("fp8", torch.float16, 16, historical=False).module("eager", 2, 32)
    deferred = CrossBackendBuilder("fp8", torch.float16, 16, historical=False).module("deferred", 2, 32)
    assert eager.weights_created and deferred.weights_created
    # Deferred: the layer was built without a config; only create_weights' update gave the backend one.
    layer = CrossAttentionModule(2, 32, torch.float16, 16, None, skip_create_weights_in_init=True)
    assert layer.backend.layout.kv_cache_dtype == "auto" and not layer.weights_created
    assert eager.backend.quant_config == deferred.backend.quant_config == QuantConfig("fp8")


@pytest.mark.parametrize("order", ["eager", "deferred"])
@pytest.mark.parametrize("historical", [False, True])
def test_unquantized_cache_is_16_bit_in_both_orders_and_versions(order, historical):
    layout = CrossBackendBuilder("auto", torch.float16, 16, historical=historical).build(order, 2, 32)
    assert layout.kv_cache_dtype == "auto" and layout.elem_bytes == 2


def cross_fallback_warnings(caplog, **kw):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="minikv.attention.cross"):
        llm = cross_stride.engine(max_num_seqs=2, backend="torch",
                                  repro=minikv.ReproConfig(cross_context_path="fallback"), **kw)
        for p in cross_stride.make_prompts(2):
            llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=3))
        prefill = llm.step()                      # the context step: its trace says which path each layer took
        while llm.has_unfinished():
            llm.step()
    paths = [e.context_path for e in prefill.trace.events if e.kind == "cross"]
    return llm, paths, [r for r in caplog.records if "falls back to the unfused path" in r.getMessage()]


def test_fallback_warns_once_per_cross_layer_and_not_for_a_16_bit_cache(caplog):
    llm, paths, records = cross_fallback_warnings(caplog, kv_cache_dtype="fp8")
    layers = [a.layer_name for a in cross_layers(llm)]
    assert len(layers) >= 2
    assert sorted(r.getMessage().split(":")[0] for r in records) == sorted(layers)
    assert paths == ["unfused"] * len(layers)
    llm, paths, records = cross_fallback_warnings(caplog, kv_cache_dtype="auto")
    assert records == []
    assert paths == ["fused"] * len(layers)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_float32_model_takes_the_unfused_path_in_every_layer(caplog, kv_cache_dtype):
    llm, paths, _ = cross_fallback_warnings(caplog, kv_cache_dtype=kv_cache_dtype, dtype=torch.float32)
    assert llm.config.dtype == torch.float32
    assert paths == ["unfused"] * len(cross_layers(llm))


def test_layout_contract_rejects_the_historical_backend_at_bind():
    with pytest.raises(minikv.KVLayoutMismatchError, match=r"1 byte\(s\) per element.*2 byte\(s\) per element"):
        cross_stride.engine("fp8", reintroduce=("cross-stride",))


def test_historical_context_read_is_wrong_at_the_context_step_only(prompts, reference):
    hist = cross_stride.run_context(prompts, reference, "historical")          # the Triton kernels
    assert hist.context_error > 0.5 and hist.decode_error < 1e-2 and hist.wrong
    runs = {v: cross_stride.run_context(prompts, reference, v, backend="torch") for v in ("fallback", "taught-fused")}
    for run in runs.values():
        assert run.context_error < 1e-2 and run.decode_error < 1e-2 and run.tokens_equal_auto and not run.wrong
    assert runs["fallback"].path == "unfused" and runs["taught-fused"].path == "fused"


@pytest.mark.parametrize("path", ["fused", "unfused"])
def test_fp8_cross_context_kernels_match_their_references(path):
    from minikv import kernels
    from minikv.cache.layout import KVLayout
    g = torch.Generator().manual_seed(0)
    layout = KVLayout("fp8", torch.float16, 2, 32, 16)
    enc = [19, 33]
    q = torch.randn(2, 4, 32, generator=g).half()
    k = torch.randn(sum(enc), 2, 32, generator=g).half()
    v = torch.randn(sum(enc), 2, 32, generator=g).half()
    table = torch.tensor([[3, 0, 0], [1, 4, 2]], dtype=torch.int32)
    slots = torch.tensor([3 * 16 + i for i in range(19)] + [[1, 4, 2][i // 16] * 16 + i % 16 for i in range(33)])
    pool = torch.zeros(5, layout.block_bytes, dtype=torch.uint8)
    kernels.write_kv(k, v, pool, slots, layout)
    cu_q = torch.tensor([0, 1, 2], dtype=torch.int32)
    lens = torch.tensor(enc, dtype=torch.int32)
    sm = 32 ** -0.5
    if path == "fused":
        out = kernels.paged_context_attention(q, pool, table, cu_q, lens, layout, False, sm)
        ref = kernels.paged_context_attention_reference(q, pool, table, cu_q, lens, layout, False, sm)
    else:
        cu_k = torch.tensor([0, 19, 52], dtype=torch.int32)
        out = kernels.context_attention(q, k, v, cu_q, cu_k, False, sm)
        ref = kernels.context_attention_reference(q, k, v, cu_q, cu_k, False, sm)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-3, rtol=2e-3)


def test_historical_context_read_locates_the_right_blocks_and_reads_them_as_16_bit():
    from minikv.kernels.addressing import row_byte_offsets

    from minikv.attention.cross import sixteen_bit_read_of
    from minikv.cache.layout import KVLayout
    pool = KVLayout("fp8", torch.float16, 2, 32, 16)
    read = sixteen_bit_read_of(pool)
    assert read.elem_bytes == 2 and read.block_bytes == pool.block_bytes and read.kv_bytes == pool.kv_bytes
    first_slots = torch.tensor([b * 16 for b in range(5)])
    for kv in (0, 1):      # slot 0, head 0 of every block, K and V halves: exactly where the pool put them
        assert torch.equal(row_byte_offsets(read, first_slots, kv)[:, 0], row_byte_offsets(pool, first_slots, kv)[:, 0])
    # Inside a block, rows are 16-bit wide: slot 1 starts where the pool's slot 2 starts.
    assert int(row_byte_offsets(read, torch.tensor([1]), 0)[0, 0]) == pool.row_offset(0, 0, 2, 0)


def test_historical_context_read_stays_inside_the_pool(prompts, reference):
    hist = cross_stride.run_context(prompts, reference, "historical", backend="torch")
    assert 0 < hist.read_end <= hist.pool_bytes
    assert hist.context_error > 0.5 and hist.decode_error < 0.2


def test_the_command_passes_and_its_results_file_has_the_schema_and_one_display_per_quantity(tmp_path, capsys,
                                                                                           monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    path = tmp_path / "results" / "cross_stride.json"
    assert main(["repro", "cross-stride", "--results", "results/cross_stride.json"]) == 0
    out = capsys.readouterr().out
    assert "overrun caught" in out and "All signatures reproduced" in out
    import json
    data = json.loads(path.read_text())
    assert set(data) == {"name", "command", "model", "notebook", "quantities", "tables"}
    assert data["notebook"] == "notebooks/04_cross_attention_stride_doubling.ipynb"
    assert data["name"] == "cross_stride" and data["model"] == "tiny-t5"
    assert data["command"] == "minikv repro cross-stride --results results/cross_stride.json"
    for q in data["quantities"].values():
        assert set(q) == {"value", "display", "statistic"} and q["display"] and q["statistic"]
    for t in data["tables"].values():
        assert set(t) == {"caption", "columns", "rows"} and all(len(r) == len(t["columns"]) for r in t["rows"])
    q = data["quantities"]
    assert q["buggy_safe_pool_factor"]["display"] == "2x"
    assert q["b1_wrong_requests_2x"]["display"] == "0 of 6" and q["b1_wrong_requests_1x"]["value"] > 0
    assert q["b2_context_error"]["value"] > 0.5 and q["b2_wrong_requests"]["value"] > 0
    assert q["b2_context_error_taught_fused"]["display"] == q["b2_context_error_fallback"]["display"] == "< 0.001"


def test_committed_results_displays_appear_in_notebook_04():
    """One number per quantity: every display string of results/cross_stride.json is printed by notebook 04."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    results = json.loads((root / "results" / "cross_stride.json").read_text())
    nb = json.loads((root / "notebooks" / "04_cross_attention_stride_doubling.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                      for o in c.get("outputs", []))
    missing = [k for k, q in results["quantities"].items() if str(q["display"]) not in printed]
    assert not missing, f"displays not printed by notebook 04: {missing}"
    assert "tiny-encdec" not in json.dumps(results) + json.dumps(nb)
