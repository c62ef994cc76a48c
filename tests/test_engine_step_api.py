"""The engine's step API, per-engine state across threads, calls that fail leave nothing behind, and every
input class of generate() and SamplingParams rejected at the boundary with its exact error type (LLM(...) and the
other methods: test_inputs.py; backend="torch": the kernel is not the point)."""
from __future__ import annotations

import threading

import pytest
import torch

import minikv
from minikv.engine.errors import ConcurrentUseError, EngineNeedsResetError

GEMMA4, T5 = "tiny-gemma4", "tiny-t5"
PROMPTS = ["3 7 11 15", "10 20 30", "2 4 6 8", "5 10 15 20 25"]


def engine(**kw):
    kw.setdefault("model", GEMMA4)
    kw.setdefault("backend", "torch")
    return minikv.LLM(**kw)


def tokens(llm, prompts=PROMPTS, **sp):
    sp.setdefault("max_tokens", 8)
    sp.setdefault("temperature", 0)
    return [o.token_ids for o in llm.generate(prompts, minikv.SamplingParams(**sp), use_tqdm=False)]


@pytest.fixture(scope="module")
def llm():
    return engine(kv_cache_dtype="int8_per_token_head", max_num_seqs=2)


# ---- 1. per-engine state ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_two_engines_in_two_threads_match_each_alone(backend):
    kws = [dict(kv_cache_dtype="int8_per_token_head", max_num_seqs=2, backend=backend),
           dict(kv_cache_dtype="fp8", max_num_seqs=3, backend=backend, seed=1)]
    prompts = PROMPTS if backend == "torch" else PROMPTS[:2]
    alone = [tokens(engine(**kw), prompts, temperature=0.7) for kw in kws]
    engines = [engine(**kw) for kw in kws]
    got, errors = [None, None], []

    def work(i):
        try:
            got[i] = [tokens(engines[i], prompts, temperature=0.7) for _ in range(2 if backend == "torch" else 1)]
        except Exception as err:  # noqa: BLE001 - reported by the assert below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(2):
        assert got[i][0] == alone[i]


def test_one_engine_from_two_threads_at_once_is_refused(llm):
    inside = threading.Event()
    rid = llm.add_request("3 7", minikv.SamplingParams(temperature=0, max_tokens=2))
    with llm._exclusive():                  # hold the engine as a running call in this thread would
        def other():
            try:
                llm.step()
            except ConcurrentUseError as err:
                seen.append(str(err))
            inside.set()
        seen: list[str] = []
        t = threading.Thread(target=other)
        t.start()
        inside.wait(30)
        t.join()
    assert seen and "another thread" in seen[0]
    while llm.has_unfinished():
        llm.step()
    assert not llm.abort(rid)


# ---- 2. the step API ------------------------------------------------------------------------------------------
def test_generate_equals_driving_the_steps(llm):
    expected = tokens(llm)
    params = minikv.SamplingParams(temperature=0, max_tokens=8)
    ids = [llm.add_request(p, params) for p in PROMPTS]
    got, steps = {}, []
    while llm.has_unfinished():
        out = llm.step()
        steps.append(out)
        got.update({r.request_id: r.token_ids for r in out.finished})
    assert [got[i] for i in ids] == expected
    first = steps[0]
    assert first.phase == "prefill" and first.request_ids == tuple(ids[:2])     # max_num_seqs=2
    assert first.trace.guard_check == "passed"
    assert all(len(first.slot_mapping[r]) == first.seq_lens[r] for r in first.request_ids)
    # The trace: sharing layers read their targets' pools and write nothing.
    ev = {e.layer: e for e in first.trace.events}
    for sharer, target in ((4, 2), (5, 3), (6, 2), (7, 3)):
        event = ev[f"model.layers.{sharer}.self_attn"]
        assert event.pool == f"kv.model.layers.{target}.self_attn" and not event.wrote
    assert first.trace.pools_written() == tuple(f"kv.model.layers.{i}.self_attn" for i in range(4))
    with pytest.raises(dataclasses_frozen()):
        first.phase = "decode"


def dataclasses_frozen():
    import dataclasses
    return dataclasses.FrozenInstanceError


def test_requests_added_between_steps_join_the_running_batch():
    llm = engine(max_num_seqs=4)
    a = llm.add_request("3 7 11", minikv.SamplingParams(temperature=0, max_tokens=6))
    assert llm.step().request_ids == (a,)
    b = llm.add_request("10 20", minikv.SamplingParams(temperature=0, max_tokens=3))
    out = llm.step()
    assert out.phase == "prefill" and out.request_ids == (b,)
    out = llm.step()
    assert out.phase == "decode" and set(out.request_ids) == {a, b}
    assert llm.abort(a) and not llm.abort(a)
    while llm.has_unfinished():
        llm.step()
    with pytest.raises(RuntimeError, match="nothing to run"):
        llm.step()


def test_snapshot_is_taken_before_finished_requests_free_blocks():
    llm = engine(max_num_seqs=1)
    llm.add_request("3 7 11", minikv.SamplingParams(temperature=0, max_tokens=1))
    out = llm.step()
    assert out.finished and out.block_tables[out.request_ids[0]] == (0,)
    assert llm.block_manager.num_free_blocks == llm.block_manager.num_blocks



def test_block_table_snapshots_are_shared_until_the_table_changes():
    """Each step's block_tables hold the table as it was at that step. Steps within one block share one tuple (no
    copy of every table per step); the step that takes a block gets a new one, the earlier outputs keep theirs."""
    from minikv.engine.sequence import Sequence
    llm = engine(max_num_seqs=1, block_size=8)
    rid = llm.add_request("3 7 11", minikv.SamplingParams(temperature=0, max_tokens=14, ignore_eos=True))
    outs = []
    while llm.has_unfinished():
        outs.append(llm.step())
    tables = [o.block_tables[rid] for o in outs]
    for o, table in zip(outs, tables):
        (slot,) = o.slot_mapping[rid][-1:]
        assert slot // 8 == table[-1] and len(table) == -(-o.seq_lens[rid] // 8)  # the new token's block is the last
    for before, after in zip(tables, tables[1:]):
        assert (after is before) == (len(after) == len(before)) and after[:len(before)] == before
    assert len({id(t) for t in tables}) == len({len(t) for t in tables}) >= 2
    seq = Sequence(0, None, [1, 2, 3])
    seq.block_table = [5]
    first = seq.table_snapshot()
    seq.block_table = [6]                       # replaced by a table of the same length (as after a preemption)
    assert first == (5,) and seq.table_snapshot() == (6,)

def test_cross_attention_trace_names_the_context_path():
    llm = engine(model=T5, kv_cache_dtype="fp8", repro=minikv.ReproConfig(cross_context_path="fallback"),
                 max_num_seqs=1)
    llm.add_request("abc1", minikv.SamplingParams(temperature=0, max_tokens=5))
    first = llm.step()
    cross = [e for e in first.trace.events if e.kind == "cross"]
    assert [e.context_path for e in cross] == ["unfused"] * len(cross) and all(e.wrote for e in cross)
    assert len(first.cross_slot_mapping[0]) == 4
    later = llm.step()
    assert all(e.read and not e.wrote for e in later.trace.events if e.kind == "cross")


def test_scale_fills_show_up_in_the_trace():
    llm = engine(kv_cache_dtype="int8_per_token_head", reintroduce=("scale-wipe",), max_num_seqs=2)
    llm.add_request(PROMPTS[0], minikv.SamplingParams(temperature=0, max_tokens=2))
    fills = llm.step().trace.scale_fills
    # Every sharing layer fills late; per shared storage only the first to touch it (4 for layer 2's cache, 5 for
    # layer 3's) wipes written scales, the second sharer (6, 7) fills scales that are 1.0 already.
    wiped = {f.layer: f.overwritten for f in fills}
    assert set(wiped) == {f"model.layers.{i}.self_attn" for i in (4, 5, 6, 7)}
    assert [wiped[f"model.layers.{i}.self_attn"] > 0 for i in (4, 5, 6, 7)] == [True, True, False, False]


# ---- 3. nothing half-done --------------------------------------------------------------------------------------
def test_failed_admission_leaves_the_engine_as_it_was():
    llm = engine(max_num_batched_tokens=20)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        llm.generate(["3 7", "1 2 3 4 5 6 7 8 9 10 11"], minikv.SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert not llm.has_unfinished()
    llm.sleep()                                   # nothing queued: sleep is allowed
    llm.wake_up()
    fresh = engine(max_num_batched_tokens=20)
    params = minikv.SamplingParams(max_tokens=6, temperature=0.9)
    out, ref = llm.generate(["3 7"], params, use_tqdm=False)[0], fresh.generate(["3 7"], params, use_tqdm=False)[0]
    assert out.request_id == ref.request_id == 0      # no id consumed
    assert out.token_ids == ref.token_ids             # seeded sampling unchanged


def test_bad_prompt_in_a_list_queues_nothing(llm):
    with pytest.raises(ValueError, match="alphabet"):
        llm.generate(["3 7", "3 7 X"], use_tqdm=False)
    assert not llm.has_unfinished()


def _overrun():
    # float16 activations, as upstream's model ran: the buggy cross backend addresses 2-byte elements
    llm = engine(model=T5, kv_cache_dtype="fp8", reintroduce=("cross-stride",), repro=minikv.ReproConfig(check_layout=False),
                 cross_pool_blocks=2, max_num_seqs=2, dtype=torch.float16)
    prompts = ["abcdefghijklmnopq1234", "zyxwvutsrqponmlkj9876"]
    with pytest.raises(minikv.KVCacheOverrunError) as info:
        llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    failed = info.value.step_output              # the failed step, as far as it got
    assert failed.phase == "prefill" and failed.trace.guard_check == "failed" and not failed.sampled
    assert [e.layer for e in failed.trace.events if e.kind == "cross"] == [f"decoder.{i}.cross_attn"
                                                                            for i in range(3)]
    return llm


def test_after_an_overrun_every_call_says_how_to_recover():
    llm = _overrun()
    assert not llm.has_unfinished()                        # in-flight requests were aborted
    for call in (lambda: llm.generate(["abc"], use_tqdm=False), lambda: llm.add_request("abc"), llm.step):
        with pytest.raises(EngineNeedsResetError, match=r"reset\(\)"):
            call()


@pytest.mark.parametrize("recover", ["reset", "sleep-wake"])
def test_reset_or_sleep_wake_up_recovers_after_an_overrun(recover):
    llm = _overrun()
    if recover == "reset":
        llm.reset()
    else:
        llm.sleep()
        llm.wake_up()
    assert not llm.arena.damaged_guards()
    out = llm.generate(["abc1"], minikv.SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert out.text == "1abc"


def test_nan_logits_name_the_layer_and_step():
    llm = engine(max_num_seqs=1)
    with torch.no_grad():
        for name, p in llm.model.named_parameters():
            if name == "model.layers.1.self_attn.q_proj.weight":
                p.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"step 0: .*layers\.1\.self_attn"):
        llm.generate(["3 7"], use_tqdm=False)
    assert not llm.has_unfinished()


@pytest.mark.parametrize("sanitize", [True, False])
def test_layer_finiteness_is_kept_only_where_sanitize_reads_it(sanitize, monkeypatch):
    """Each layer's "output was finite" flag costs two launches; only sanitize's check reads it."""
    llm = engine(max_num_seqs=1, sanitize=sanitize)
    seen, forward = [], llm.runner.forward

    def recorded(*args, **kwargs):
        logits, ctx = forward(*args, **kwargs)
        seen.append(ctx)
        return logits, ctx
    monkeypatch.setattr(llm.runner, "forward", recorded)
    llm.generate(["3 7"], minikv.SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    layers = len(llm.model.attention_layers())
    assert [len(ctx.finite) for ctx in seen] == [layers if sanitize else 0] * len(seen) and seen


# ---- 4. inputs: the matrix ------------------------------------------------------------------------------------
class Gen:
    def __iter__(self):
        yield "3 7"


GENERATE_INPUTS = [
    ("none", None, None, TypeError),
    ("bytes", b"3 7", None, TypeError),
    ("number", 37, None, TypeError),
    ("generator", (p for p in ["3 7"]), None, TypeError),
    ("iterable", Gen(), None, TypeError),
    ("array", torch.tensor([3, 7]), None, TypeError),
    ("list with bytes", ["3 7", b"1"], None, TypeError),
    ("empty prompt", [""], None, ValueError),
    ("whitespace only", ["   "], None, ValueError),
    ("outside alphabet", ["3 7 A"], None, ValueError),
    ("no room to generate", ["1 " * 63 + "1"], None, ValueError),
    ("max_tokens beyond room", ["3 7"], minikv.SamplingParams(temperature=0, max_tokens=200), ValueError),
    ("params not SamplingParams", ["3 7"], {"max_tokens": 3}, TypeError),
    ("params list length", ["3 7", "1 2"], [minikv.SamplingParams(temperature=0)], ValueError),
    ("params list of dicts", ["3 7"], [{"max_tokens": 3}], TypeError),
]


@pytest.mark.parametrize("case,prompts,params,error", GENERATE_INPUTS, ids=[c[0] for c in GENERATE_INPUTS])
def test_generate_rejects(llm, case, prompts, params, error):
    with pytest.raises(error):
        llm.generate(prompts, params, use_tqdm=False)
    assert not llm.has_unfinished()


def test_bare_str_is_one_prompt_and_empty_list_is_nothing(llm):
    assert len(llm.generate("3 7", minikv.SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)) == 1
    assert llm.generate([], use_tqdm=False) == []


SAMPLING_INPUTS = [
    ("max_tokens 0", dict(max_tokens=0), ValueError),
    ("max_tokens float", dict(max_tokens=2.0), TypeError),
    ("max_tokens bool", dict(max_tokens=True), TypeError),
    ("temperature negative", dict(temperature=-1), ValueError),
    ("temperature nan", dict(temperature=float("nan")), ValueError),
    ("temperature inf", dict(temperature=float("inf")), ValueError),
    ("temperature tiny", dict(temperature=1e-9), ValueError),
    ("temperature str", dict(temperature="0.5"), TypeError),
    ("seed negative", dict(seed=-1), ValueError),
    ("seed huge", dict(seed=2**64), ValueError),
    ("seed float", dict(seed=1.5), TypeError),
    ("stop int", dict(stop=5), TypeError),
    ("stop empty", dict(stop=[""]), ValueError),
    ("ignore_eos int", dict(ignore_eos=1), TypeError),
]


@pytest.mark.parametrize("case,kw,error", SAMPLING_INPUTS, ids=[c[0] for c in SAMPLING_INPUTS])
def test_sampling_params_rejects(case, kw, error):
    with pytest.raises(error):
        minikv.SamplingParams(**kw)


def test_sampling_params_are_frozen():
    with pytest.raises(dataclasses_frozen()):
        minikv.SamplingParams(temperature=0).max_tokens = 3


def test_stop_string_is_cut_from_the_text_and_token_ids_keep_every_token(llm):
    params = minikv.SamplingParams(temperature=0, max_tokens=12, stop=("27",))
    out = llm.generate(["3 7 11 15"], params, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == "27" and out.text == " 19 23 "
    assert llm.tokenizer.decode(out.token_ids) == " 19 23 27"
