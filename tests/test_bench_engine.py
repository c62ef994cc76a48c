"""`minikv.bench engine --device cuda` without a GPU: its plan of runs, its CLI, its targets and reports on hand-made
rows, gpu_rows/gpu_main with the measurements stubbed, and the SDPA reference step (minikv.bench.sdpa_step) run
eagerly on CPU at tiny dimensions against the dense model; and tools/gpu_probes/engine_ab.sh's check that its
baseline is not the working tree."""
from __future__ import annotations

import csv

import pytest
import torch

from minikv.bench import engine
from minikv.bench.sdpa_step import SdpaDecodeStep, e2b_like_config, e2b_like_model

FORMATS = ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head")


def _row(fmt, batch, context, mode, tps, **more):
    r = {"format": fmt, "batch": batch, "context": context, "mode": mode, "decode_tokens_per_s": float(tps),
         "decode_ms_per_step": 1e3 * batch / tps}
    if not mode.startswith("sdpa"):
        r["prefill_tokens_per_s"] = 50000.0
    return r | more


def _rows():
    """A run in plan order: the main context (2048) first, batch 1, then 8192 and 512."""
    rows = [_row(f, 64, 2048, "replayed", 4000 + 100 * i, graph_replay_tokens_per_s=5000.0, graph_replay_ms=12.8,
                 bound_ms=6.4 + i) for i, f in enumerate(FORMATS)]
    rows += [_row("auto", 64, 2048, "eager", 800), _row("int8_per_token_head", 64, 2048, "eager", 790),
             _row("auto", 64, 2048, "sdpa-graph", 8000)]
    rows += [_row("auto", 1, 2048, "replayed", 125, graph_replay_ms=7.5), _row("auto", 1, 2048, "eager", 17),
             _row("auto", 1, 2048, "sdpa-graph", 500)]
    for ctx, base in ((8192, 3600), (512, 4500)):
        rows += [_row(f, 64, ctx, "replayed", base + 200 * i) for i, f in enumerate(FORMATS)]
        rows += [_row("auto", 64, ctx, "eager", 700), _row("int8_per_token_head", 64, ctx, "eager", 690),
                 _row("auto", 64, ctx, "sdpa-graph", 7000)]
    return rows


# ---- the plan and the CLI -----------------------------------------------------------------------------------------

def test_plan_measures_every_format_at_every_context_main_context_first():
    runs = engine.plan(FORMATS, 64, 2048, (512, 2048, 8192))
    assert len(runs) == len(set(runs)) == 3 * (4 + 2 + 1) + 3
    assert runs[:4] == [(f, 64, 2048, "graph") for f in FORMATS]                 # the targets' rows come first
    assert [r[2] for r in runs if r[1] == 64 and r[3] == "graph"] == [2048] * 4 + [8192] * 4 + [512] * 4
    for ctx in (512, 2048, 8192):
        assert {(f, how) for f, b, c, how in runs if (b, c) == (64, ctx)} == (
            {(f, "graph") for f in FORMATS} | {("auto", "eager"), ("int8_per_token_head", "eager"), ("auto", "sdpa")})
    assert [how for f, b, c, how in runs if b == 1] == ["graph", "eager", "sdpa"]


def test_plan_without_extras_and_with_fewer_formats_elsewhere():
    runs = engine.plan(FORMATS, 64, 2048, (2048, 8192), context_formats=("auto", "fp8"), extras=False)
    assert runs == [(f, 64, 2048, "graph") for f in FORMATS] + [("auto", 64, 8192, "graph"), ("fp8", 64, 8192, "graph")]


@pytest.mark.parametrize("argv, contexts", [
    ([], [512, 2048, 8192]),
    (["--contexts", "4096", "1024"], [1024, 2048, 4096]),                   # --context is always measured
    (["--context", "1024", "--contexts", "512"], [512, 1024]),
    (["--long-context", "0"], [2048]),                                       # the older form: --context alone
    (["--long-context", "16384", "--contexts", "512"], [2048, 16384]),       # ... or --context and N
])
def test_contexts_option(argv, contexts):
    assert engine.contexts_of(engine.parser().parse_args(["--device", "cuda", *argv])) == contexts


def test_format_options():
    assert engine.parser().parse_args(["--new-tokens", "12"]).new_tokens == 12
    args = engine.parser().parse_args(["--long-formats", "auto", "fp8", "--eager-formats", "auto"])
    assert args.context_formats == ["auto", "fp8"] and args.eager_formats == ["auto"]
    args = engine.parser().parse_args([])
    assert args.context_formats is None and args.eager_formats == list(engine.EAGER_FORMATS)
    with pytest.raises(SystemExit):
        engine.parser().parse_args(["--contexts", "0"])


# ---- targets and reports ------------------------------------------------------------------------------------------

def test_targets_ignore_the_eager_and_sdpa_rows_and_the_other_contexts():
    got = {what: round(value, 4) for what, value, _ in engine.targets(_rows())}
    assert len(got) == 4 + 3 + 4 + 3 + 1 + 4
    assert got["engine decode mean step vs its own graph replay, fp8, batch 64, context 2048"] == 0.82
    for ctx, tps in ((2048, 4000), (8192, 3600), (512, 4500)):     # SDPA step ms / engine step ms, bf16
        assert got[f"engine decode mean step vs the SDPA graph step, bf16, batch 64, context {ctx}"] == round(
            (64000 / 8000 if ctx == 2048 else 64000 / 7000) / (64000 / tps), 4)
    for i, f in enumerate(FORMATS):
        assert got[f"graph replay vs the physical bound (bytes read / copy bandwidth), {f}, batch 64, context "
                   "2048"] == round((6.4 + i) / 12.8, 4)
    for i, f in enumerate(FORMATS[1:], 1):           # the 1-byte formats against bf16 at the longest context
        assert got[f"{f} vs bf16 engine decode tokens/s, batch 64, context 8192 (default placement)"] == round(
            (3600 + 200 * i) / 3600, 4)
    assert got["bf16 engine decode, CUDA graphs vs eager, batch 64, context 2048"] == 5.0
    assert [w for w in got if w.startswith("prefill")] == [f"prefill tokens/s, {f}, vs 5 x 23,000" for f in FORMATS]


def test_step_targets_read_the_median_step_where_a_row_has_one():
    """The first step after a prefill and the step that frees every block are per-request work: the per-step
    targets read the median full step; rows written before that column fall back to the mean."""
    rows = _rows()
    rows[0] |= {"step_ms": 14.0, "graph_replay_ms": 12.6}          # auto, 2048: mean 16 ms, median 14 ms
    got = {what: round(value, 4) for what, value, _ in engine.targets(rows)}
    assert got["engine decode median step vs its own graph replay, auto, batch 64, context 2048"] == 0.9
    assert got["engine decode median step vs the SDPA graph step, bf16, batch 64, context 2048"] == round(8 / 14, 4)
    assert engine.per_step_ms(rows[1]) == rows[1]["decode_ms_per_step"]
    assert engine.per_step_ms(rows[1] | {"step_ms": ""}) == rows[1]["decode_ms_per_step"]     # an empty CSV cell


def test_step_figures_leave_out_the_graphs_first_launch_and_the_step_that_frees_every_block():
    steps = [6.17, 5.02, 4.87, 4.86, 4.87, 4.85, 8.93]                    # ms, an H100 run's shape
    got = engine.step_figures([t / 1e3 for t in steps])
    assert round(got["step_ms"], 6) == 4.87 and round(got["min_ms"], 6) == 4.85 and round(got["max_ms"], 6) == 5.02
    assert got["noisy"] is False and got["steps_ms"] == "6.17 5.02 4.87 4.86 4.87 4.85 8.93"
    assert engine.step_figures([t / 1e3 for t in (4.9, 5.0, 4.9, 5.0, 5.6, 5.0)])["noisy"] is True
    assert round(engine.step_figures([0.005, 0.006])["step_ms"], 6) == 5.5            # too few to leave any out


def test_the_prefill_target_is_read_only_at_the_prompt_length_it_was_set_at():
    """5 x 23,000 tokens/s was set at 2,048-token prompts; a run whose main context is longer reports no such line
    (its attention grows with the prompt's square: 32,768-token prompts read 0.3x of it on an H100)."""
    long = [r | {"context": 32768} for r in _rows() if r["context"] == 2048 and r["batch"] == 64]
    got = [what for what, _, _ in engine.targets(long)]
    assert not [w for w in got if w.startswith("prefill")]
    assert "engine decode mean step vs its own graph replay, auto, batch 64, context 32768" in got


def test_targets_on_rows_read_back_from_the_csv(tmp_path):
    path = tmp_path / "engine.csv"
    engine.write_csv(_rows(), path)
    with open(path) as f:
        back = [{k: (float(v) if k not in ("format", "mode") and v != "" else v) for k, v in r.items()}
                for r in csv.DictReader(f)]
    assert [(w, round(v, 6)) for w, v, _ in engine.targets(back)] == [
        (w, round(v, 6)) for w, v, _ in engine.targets(_rows())]
    assert [(w, round(v, 6)) for w, v in engine.reports(back)] == [(w, round(v, 6)) for w, v in engine.reports(_rows())]


def test_reports_the_sdpa_step_over_the_engine_at_each_batch_and_context():
    got = engine.reports(_rows())
    assert [round(v, 4) for _, v in got] == [0.5, 0.25, round(3600 / 7000, 4), round(4500 / 7000, 4)]
    assert got[1][0] == ("time per output token, SDPA graph step (2.00 ms) / engine (8.00 ms; its graph replay "
                         "alone 7.50 ms), bf16, batch 1, context 2048")
    eager_sdpa = [r | {"mode": "sdpa-eager"} if r["mode"] == "sdpa-graph" else r for r in _rows()]
    assert engine.reports(eager_sdpa) == []                  # an SDPA step that was not captured is no reference


# ---- gpu_rows and gpu_main with the measurements stubbed ----------------------------------------------------------

@pytest.fixture
def stubbed(monkeypatch):
    calls = []

    def decode_speed(path, fmt, batch, context, new_tokens, enforce_eager=None, profile=None, copy_GBps=None):
        assert copy_GBps == 4000.0
        calls.append((fmt, batch, context, enforce_eager))
        tps = (800 if enforce_eager else 4000) + (fmt != "auto") * 400 - context / 100
        return _row(fmt, batch, context, "eager" if enforce_eager else "replayed", tps)

    monkeypatch.setattr(engine, "e2b_like_checkpoint", lambda path, **kw: calls.append(("checkpoint", kw)))
    monkeypatch.setattr(engine, "gpu_decode_speed", decode_speed)
    monkeypatch.setattr(engine, "copy_bandwidth", lambda: 4000.0)
    monkeypatch.setattr(engine, "sdpa_row", lambda b, c: _row("auto", b, c, "sdpa-graph", 10000, timing="cuda graph"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stub")
    return calls


def test_gpu_rows_runs_the_plan_and_writes_the_csv_after_every_run(stubbed, tmp_path):
    path = tmp_path / "rows.csv"
    rows = engine.gpu_rows(("auto", "fp8"), 64, 2048, 16, log=lambda line: None, contexts=(512, 2048),
                           eager_formats=("auto",), csv_path=path)
    assert stubbed[0] == ("checkpoint", {"max_position_embeddings": 4096})
    assert stubbed[1:] == [("auto", 64, 2048, None), ("fp8", 64, 2048, None), ("auto", 64, 2048, True),
                           ("auto", 1, 2048, None), ("auto", 1, 2048, True), ("auto", 64, 512, None),
                           ("fp8", 64, 512, None), ("auto", 64, 512, True)]
    assert [(r["format"], r["batch"], r["context"], r["mode"]) for r in rows if r["mode"] == "sdpa-graph"] == [
        ("auto", 64, 2048, "sdpa-graph"), ("auto", 1, 2048, "sdpa-graph"), ("auto", 64, 512, "sdpa-graph")]
    x = {(r["format"], r["batch"], r["context"], r["mode"]): r.get("x_auto") for r in rows}
    assert x[("fp8", 64, 512, "replayed")] == pytest.approx((4400 - 5.12) / (4000 - 5.12))
    assert x[("auto", 64, 2048, "eager")] == 1.0 and x[("auto", 64, 2048, "sdpa-graph")] is None
    assert all(r["run_s"] >= 0 for r in rows)
    with open(path) as f:
        assert len(list(csv.DictReader(f))) == len(rows) == 11


def test_a_failing_sdpa_step_is_logged_and_the_engine_runs_go_on(stubbed, monkeypatch):
    def fail(b, c):
        raise RuntimeError("no kernel")
    monkeypatch.setattr(engine, "sdpa_row", fail)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    lines = []
    rows = engine.gpu_rows(("auto",), 64, 2048, 16, log=lines.append, contexts=(2048,), eager_formats=())
    assert [(r["batch"], r["mode"]) for r in rows] == [(64, "replayed"), (1, "replayed"), (1, "eager")]
    assert "  SDPA step, batch 1, context 2048: failed (RuntimeError: no kernel)" in lines


@pytest.mark.parametrize("spreads, kept, remeasured, still_noisy", [
    ((0.02,), 0.02, 0, False),                          # steady at once: run once
    ((0.30, 0.15, 0.04), 0.04, 2, False),               # re-run until steady
    ((0.30, 0.40, 0.20, 0.25), 0.20, 3, True),          # at most three more runs; the least spread is kept
])
def test_a_noisy_engine_row_is_measured_again(stubbed, monkeypatch, spreads, kept, remeasured, still_noisy):
    runs = iter(spreads)
    profiles = []

    def decode_speed(path, fmt, batch, context, new_tokens, enforce_eager=None, profile=None, copy_GBps=None):
        profiles.append(profile)
        spread = next(runs)
        return _row(fmt, batch, context, "replayed", 4000, step_ms=10.0, min_ms=10.0, max_ms=10.0 * (1 + spread),
                    noisy=spread > engine.NOISY)
    monkeypatch.setattr(engine, "gpu_decode_speed", decode_speed)
    lines = []
    rows = engine.gpu_rows(("auto",), 64, 2048, 16, log=lines.append, contexts=(2048,), extras=False)
    assert len(profiles) == remeasured + 1 and all(p is None for p in profiles[1:])
    assert rows[0]["max_ms"] == pytest.approx(10.0 * (1 + kept)) and rows[0]["remeasured"] == remeasured
    assert any("still spread" in line for line in lines) == still_noisy


def test_gpu_rows_sizes_the_checkpoint_for_the_longest_context(stubbed):
    engine.gpu_rows(("auto",), 64, 2048, 16, log=lambda line: None, contexts=(8192,), extras=False)
    assert stubbed[0] == ("checkpoint", {"max_position_embeddings": 8192 + 32})


def test_gpu_main_prints_batch_1_beside_the_sdpa_step_then_reports_and_targets(stubbed, capsys, tmp_path):
    argv = ["--device", "cuda", "--kv-cache-dtypes", "auto", "fp8", "--contexts", "2048", "--csv",
            str(tmp_path / "e.csv")]
    assert engine.main(argv) == 0
    out = capsys.readouterr().out
    b1 = next(line for line in out.splitlines() if line.startswith("batch 1, bf16"))
    assert b1 == "batch 1, bf16: time per output token eager 1.28 ms, replayed 0.25 ms, sdpa-graph 0.10 ms"
    assert out.index("report ") < out.index("\ntargets")
    assert "report  0.397x  time per output token, SDPA graph step (0.10 ms) / engine (0.25 ms), bf16, batch 1" in out
    assert "MISSED" in out or "met" in out


def test_one_byte_targets_are_set_per_context():
    """1.25x bf16's tokens/s at context 8192 and 1.4x at 32768; other contexts have no 1-byte target."""
    rows = _rows() + [_row(f, 64, 32768, "replayed", 1000 + 300 * i) for i, f in enumerate(FORMATS)]
    got = {what: (round(value, 4), goal) for what, value, goal in engine.targets(rows) if "vs bf16 engine" in what}
    assert got["fp8 vs bf16 engine decode tokens/s, batch 64, context 8192 (default placement)"] == (
        round(3800 / 3600, 4), 1.25)
    assert got["fp8_per_token_head vs bf16 engine decode tokens/s, batch 64, context 32768 (default placement)"] == (
        1.9, 1.4)
    assert len(got) == 6


def test_the_attention_bench_adds_the_engine_part_to_a_recording(stubbed, tmp_path, capsys, monkeypatch):
    """`minikv.bench attention --engine-only`: the engine's rows join the kernels' rows of an earlier call on the
    same GPU; a row measured again replaces the older one; another GPU's recording is refused."""
    from minikv.bench import attention
    path = tmp_path / "gpu_attention.csv"
    kernel_row = {"kind": "decode", "format": "auto", "batch": 64, "context": 4096, "ms": 0.2, "sdpa_over_minikv": 0.9,
                  "gpu": "stub"}
    old = {"kind": "engine-decode", **_row("auto", 64, 2048, "replayed", 1), "gpu": "stub"}
    attention.write_csv([kernel_row, old], path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert attention.main(["--csv", str(path), "--engine-only", "--engine-args",
                           "--kv-cache-dtypes auto fp8 --contexts 2048 --no-extras"]) == 0
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [(r["kind"], r["format"], r["mode"] or None) for r in rows] == [
        ("decode", "auto", None), ("engine-decode", "auto", "replayed"), ("engine-decode", "fp8", "replayed")]
    assert float(rows[1]["decode_tokens_per_s"]) != 1 and {r["gpu"] for r in rows} == {"stub"}
    assert "vs bf16 engine" not in capsys.readouterr().out     # no 8192 row: no 1-byte target
    rows[0]["gpu"] = "another GPU"
    attention.write_csv(rows, path)
    with pytest.raises(SystemExit, match="measured on another GPU, this is stub"):
        attention.run(log=lambda line: None, csv_path=path, kernels=False, engine_args=["--no-extras"])
    with pytest.raises(SystemExit, match="--peer-only needs --peer"):
        engine.measured_rows(engine.gpu_args(["--peer-only"]), print)
    with pytest.raises(SystemExit):             # argparse: nothing to add rows to
        attention.main(["--engine-only", "--csv", str(tmp_path / "none.csv")])


# ---- the SDPA reference step ------------------------------------------------------------------------------------

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 10, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "full_head_dim": 32, "sliding_window": 4, "num_kv_shared_layers": 4,
        "hidden_size_per_layer_input": 8}


def test_e2b_like_config_is_the_benchmark_model():
    from minikv.models.gemma4 import FULL, Gemma4Config
    c = Gemma4Config.from_hf_dict(e2b_like_config())
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads) == (35, 1536, 6144, 8)
    assert [i for i, t in enumerate(c.layer_types) if t == FULL] == list(range(4, 35, 5))
    assert {c.layer_head_dims[i] for i in range(35)} == {256, 512} and set(c.layer_kv_heads) == {1}
    assert (c.sliding_window, c.first_kv_shared_layer, c.hidden_activation) == (512, 15, "gelu_pytorch_tanh")


def test_sdpa_step_gives_a_token_per_sequence_deterministically():
    def tokens(seed):
        return SdpaDecodeStep(e2b_like_model("cpu", **TINY), batch=3, context=9, seed=seed)()
    out = tokens(0)
    assert out.shape == (3,) and out.dtype == torch.int64
    assert torch.equal(out, tokens(0))
    step = SdpaDecodeStep(e2b_like_model("cpu", **TINY), batch=3, context=9)
    assert {i: tuple(k.shape) for i, (k, v) in step.caches.items()} == {
        0: (3, 2, 9, 16), 1: (3, 2, 9, 16), 2: (3, 2, 9, 16), 3: (3, 2, 9, 16), 4: (3, 1, 9, 32), 5: (3, 2, 9, 16)}
    assert step.caches[0][0].dtype == torch.bfloat16


@pytest.mark.parametrize("context", [3, 9])          # within the window and past it
def test_sdpa_step_computes_what_the_dense_model_does(context):
    """The step over a cache holding a prompt's K/V gives the dense model's logits for the prompt's next token:
    the same model, window, KV sharing, rotary and cache write."""
    model = e2b_like_model("cpu", torch.float32, **TINY)
    prompt = torch.randint(model.config.vocab_size, (3, context), generator=torch.Generator().manual_seed(1))
    from minikv.models.gemma4 import DenseKVCache
    cache = DenseKVCache()
    with torch.no_grad():
        model(prompt[:, :-1], cache=cache)
        want = model.logits(prompt)[:, -1]
    step = SdpaDecodeStep(model, batch=3, context=context)
    assert set(cache.kv) == set(step.caches)
    for i, (k, v) in cache.kv.items():
        step.caches[i][0][:, :, :-1] = k
        step.caches[i][1][:, :, :-1] = v
    step.input_ids = prompt[:, -1].clone()
    torch.testing.assert_close(step.logits(), want, atol=2e-5, rtol=1e-4)
    assert torch.equal(step(), want.argmax(-1))
    torch.testing.assert_close(step.logits(), want, atol=2e-5, rtol=1e-4)    # the rewrite of the last slot


def test_decode_step_bytes_counts_weights_once_and_kv_per_sequence_and_window():
    import minikv
    llm = minikv.LLM(model="tiny-gemma4", backend="torch", max_num_seqs=2, seed=0)
    model, bindings = llm.runner.model, [b for b in llm.runner.bindings.values() if b.kind == "self"]
    windows = [getattr(b.impl, "sliding_window", 0) or 0 for b in bindings]
    assert any(windows) and not all(windows)         # the tiny model has sliding and full layers
    short, long = min(w for w in windows if w) // 2, 4 * max(windows)
    per_token = {c: sum(b.layout.bytes_per_token() * min(c, w or c) for b, w in zip(bindings, windows))
                 for c in (short, long)}
    one, two = engine.decode_step_bytes(llm, 1, short), engine.decode_step_bytes(llm, 2, short)
    row_bytes = sum(m.weight.shape[1] * m.weight.element_size() for m in model.modules()
                    if isinstance(m, torch.nn.Embedding))
    assert two - one == per_token[short] + row_bytes                 # one more sequence: its K/V and its rows
    assert engine.decode_step_bytes(llm, 1, long) - one == per_token[long] - per_token[short]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert one > weights / 2 and one < 2 * weights + per_token[short] + row_bytes


def test_block_placed_formats_are_measured_and_targeted_beside_the_default_placement():
    """"/block" names a per-token-head format with kv_scale_placement="block": a CLI choice, the engine's own
    cache arguments, the same KV bytes per sequence, and a 1-byte target of its own per context."""
    import minikv
    args = engine.gpu_args(["--kv-cache-dtypes", "auto", "fp8_per_token_head/block", "--context-formats",
                            "int8_per_token_head/block"])
    assert args.kv_cache_dtypes == ["auto", "fp8_per_token_head/block"]
    assert args.context_formats == ["int8_per_token_head/block"]
    with pytest.raises(SystemExit):
        engine.gpu_args(["--kv-cache-dtypes", "fp8/block"])
    llm = minikv.LLM(model="tiny-gemma4", device="cpu", **engine.cache_args("int8_per_token_head/block"))
    assert (llm.config.cache.kv_cache_dtype, llm.config.cache.kv_scale_placement) == ("int8_per_token_head", "block")
    assert engine.cache_args("fp8") == {"kv_cache_dtype": "fp8", "kv_scale_placement": "row"}
    assert engine.kv_bytes_per_sequence("fp8_per_token_head/block", 8192) == engine.kv_bytes_per_sequence(
        "fp8_per_token_head", 8192)
    rows = _rows() + [_row(f, 64, 8192, "replayed", 5400 + 100 * i) for i, f in enumerate(engine.BLOCK_PLACED)]
    got = {what: (round(value, 4), goal) for what, value, goal in engine.targets(rows) if "vs bf16 engine" in what}
    assert got["fp8_per_token_head vs bf16 engine decode tokens/s, batch 64, context 8192 (block placement)"] == (
        1.5, 1.25)
    assert got["int8_per_token_head vs bf16 engine decode tokens/s, batch 64, context 8192 (block placement)"] == (
        round(5500 / 3600, 4), 1.25)
    assert got["fp8_per_token_head vs bf16 engine decode tokens/s, batch 64, context 8192 (default placement)"] == (
        round(4200 / 3600, 4), 1.25)
    assert len(got) == 5


def test_capacity_runs_fit_the_budget_and_are_summarised(stubbed):
    for fmt in FORMATS:
        b = engine.capacity_batch(fmt, 8192, 16, new_tokens=16)
        per_seq = engine.kv_bytes_per_sequence(fmt, 8192 + 16)
        assert b * per_seq <= 16 * 2**30 < (b + 1) * per_seq
    assert engine.capacity_batch("int8_per_token_head") > 1.8 * engine.capacity_batch("auto")   # 1 byte vs 2
    rows = engine.gpu_rows(("auto", "fp8"), 64, 2048, 16, log=lambda line: None, contexts=(2048,), extras=False,
                           capacity=True)
    assert stubbed[0] == ("checkpoint", {"max_position_embeddings": 8192 + 32})
    cap = [(r["format"], r["batch"], r["context"]) for r in rows if r["mode"] == "capacity"]
    assert cap == [(f, engine.capacity_batch(f), 8192) for f in ("auto", "fp8")]
    text = "\n".join(engine.summary(rows))
    assert f"fp8                    batch {engine.capacity_batch('fp8'):4d}" in text and "x bf16's" in text
    # --capacity-only: the capacity runs and nothing else (a device call of their own)
    stubbed.clear()
    args = engine.gpu_args(["--capacity-only", "--kv-cache-dtypes", "auto", "fp8"])
    only = engine.measured_rows(args, lambda line: None)
    assert stubbed[1:] == [(f, engine.capacity_batch(f), 8192, None) for f in ("auto", "fp8")]
    assert [(r["format"], r["batch"], r["mode"]) for r in only] == [(f, engine.capacity_batch(f), "capacity")
                                                                    for f in ("auto", "fp8")]


@pytest.mark.parametrize("has_minikv", [True, False])
def test_engine_ab_stops_when_the_baseline_would_be_the_working_tree(has_minikv):
    """tools/gpu_probes/engine_ab.sh runs a baseline copy from its own directory (`python -m` puts the working
    directory first on sys.path: run from the repository, the "baseline" was the working tree, and the A/Bs of
    2026-12-06 measured one tree twice). Here on stand-in baselines: one whose minikv is an empty package is
    imported and passes the check; one without a minikv would import the working tree's, and the script stops."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    base = root / "build" / "engine_ab_test_base"
    shutil.rmtree(base, ignore_errors=True)
    for package in ("minikv", "kernels") if has_minikv else ("kernels",):
        (base / package).mkdir(parents=True)
        (base / package / "__init__.py").write_text("")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "AB_TIMEOUT": "5",
           "PYTHONPATH": ""}
    try:
        run = subprocess.run(["bash", "tools/gpu_probes/engine_ab.sh", "base", "build/engine_ab_test_base",
                              str(base / "out")], cwd=root, capture_output=True, text=True, env=env)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    imported = run.stdout.splitlines()[0]
    assert imported == f"minikv from {base / 'minikv' / '__init__.py'}" if has_minikv else \
        imported == f"minikv from {root / 'minikv' / '__init__.py'}", run.stdout + run.stderr
    assert ("the baseline imported another minikv" in run.stdout) != has_minikv, run.stdout + run.stderr
    if not has_minikv:
        assert run.returncode == 1
