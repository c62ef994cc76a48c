"""Engine-level tests: the same tokens whatever the backend, prefix caching, preemption, sleep/wake_up; bad input
rejected with clear errors before anything runs; the arena's canaries intact after every run.

The first test runs the Triton kernels (in the interpreter on a CPU) against the torch backend in every KV cache
format; the scheduler, block manager and arena properties after it run on the torch backend, the same engine
Python at a fraction of the interpreter's cost (the kernels' own block-table tests: test_kernels_decode.py and
test_kernels_context.py)."""
from __future__ import annotations

import pytest
import torch

import minikv

GEMMA4 = "tiny-gemma4"


def greedy(n=12):
    return minikv.SamplingParams(temperature=0, max_tokens=n)


@pytest.fixture(scope="module")
def prompts():
    return minikv.tasks.for_model(GEMMA4).prompts(6, seed=3)


def run(prompts, **kw):
    kw.setdefault("model", GEMMA4)
    kw.setdefault("backend", "torch")
    llm = minikv.LLM(**kw)
    outs = llm.generate(prompts, greedy(), use_tqdm=False)
    llm.arena.check()                                   # canaries intact after every run
    return llm, [o.token_ids for o in outs]


@pytest.mark.parametrize("fmt", ["auto", "int8_per_token_head", "fp8_per_token_head", "fp8"])
def test_triton_and_torch_backends_give_identical_tokens(prompts, fmt):
    # Four requests of different lengths, two at a time: batched decode, and prefills joining a running batch.
    tokens = {}
    for backend in ("triton", "torch"):
        llm = minikv.LLM(model=GEMMA4, kv_cache_dtype=fmt, backend=backend, max_num_seqs=2)
        outs = llm.generate(prompts[:4], [greedy(n) for n in (4, 8, 6, 8)], use_tqdm=False)
        llm.arena.check()
        assert llm.scheduler.num_preemptions == 0
        tokens[backend] = [o.token_ids for o in outs]
    assert tokens["triton"] == tokens["torch"]
    assert [len(t) for t in tokens["torch"]] == [4, 8, 6, 8]


def test_outputs_are_right_and_prefix_caching_changes_nothing():
    task = minikv.tasks.for_model(GEMMA4)
    # Long prompts (> 2 blocks) sharing their first blocks: prefix caching really hits.
    base = task.prompts(2, seed=5, num_tokens=40)
    prompts = [base[0], base[1], base[0], base[0]]
    llm_off, off = run(prompts, kv_cache_dtype="int8_per_token_head", max_num_seqs=2)
    llm_on, on = run(prompts, kv_cache_dtype="int8_per_token_head", max_num_seqs=2, enable_prefix_caching=True)
    assert on == off
    assert llm_on.block_manager.num_hit_blocks > 0
    texts = [llm_on.tokenizer.decode(t) for t in on]
    assert all(task.check(p, t) for p, t in zip(prompts, texts))


def test_preemption_gives_identical_tokens():
    # 31-token prompts take 2 blocks each and a third at token 33: 8 blocks admit four, then decoding runs out
    prompts = minikv.tasks.for_model(GEMMA4).prompts(6, seed=3, num_tokens=31)
    _, roomy = run(prompts, kv_cache_dtype="int8_per_token_head", max_num_seqs=6)
    llm, tight = run(prompts, kv_cache_dtype="int8_per_token_head", max_num_seqs=6, num_blocks=8)
    assert llm.scheduler.num_preemptions > 0
    assert tight == roomy


def test_identical_prompts_give_identical_outputs(prompts):
    _, out = run([prompts[0]] * 5, kv_cache_dtype="fp8_per_token_head", max_num_seqs=3)
    assert all(o == out[0] for o in out)


def test_sleep_wake_up_gives_identical_outputs(prompts):
    llm = minikv.LLM(model=GEMMA4, kv_cache_dtype="int8_per_token_head", max_num_seqs=4, backend="torch")
    before = [o.token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]
    old = llm.arena
    llm.sleep()
    assert llm.arena is None
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate(prompts, greedy(), use_tqdm=False)
    llm.wake_up()
    assert llm.arena is not old
    after = [o.token_ids for o in llm.generate(prompts, greedy(), use_tqdm=False)]
    llm.arena.check()
    assert after == before


def test_temperature_sampling_is_seeded(prompts):
    llm = minikv.LLM(model=GEMMA4, max_num_seqs=4, backend="torch")
    p = minikv.SamplingParams(max_tokens=8, temperature=1.0, seed=7)
    a = [o.token_ids for o in llm.generate(prompts[:3], p, use_tqdm=False)]
    b = [o.token_ids for o in llm.generate(prompts[:3], p, use_tqdm=False)]
    assert a == b


def test_encoder_decoder_generates_right_answers():
    task = minikv.tasks.for_model("tiny-t5")
    prompts = task.prompts(4, seed=1)
    llm = minikv.LLM(model="tiny-t5", kv_cache_dtype="fp8", max_num_seqs=4, backend="torch")
    outs = llm.generate(prompts, [minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p)) for p in prompts],
                        use_tqdm=False)
    llm.arena.check()
    assert all(task.check(p, o.text) for p, o in zip(prompts, outs))


# ---- bad input: a clear error, nothing half-done ------------------------------------------------------------------
def test_bad_input_is_rejected_clearly(prompts):
    llm = minikv.LLM(model=GEMMA4, max_num_seqs=2, backend="torch")
    with pytest.raises(ValueError, match="empty prompt"):
        llm.generate([prompts[0], ""], greedy(), use_tqdm=False)
    with pytest.raises(ValueError, match="outside tiny-gemma4's domain.*at most 95 characters"):
        llm.generate([" ".join(str(i) for i in range(100))], greedy(), use_tqdm=False)
    for outside in ["5000 6000", "9 5 1", "4 4 4"]:             # first term too large, decreasing, step 0
        with pytest.raises(ValueError, match=f"'{outside}' is outside tiny-gemma4's domain"):
            llm.generate([prompts[0], outside], greedy(), use_tqdm=False)
    with pytest.raises(ValueError, match="two or more non-negative integers"):
        llm.add_request("7", greedy())
    with pytest.raises(ValueError, match="max_tokens"):
        minikv.SamplingParams(temperature=0, max_tokens=0)
    assert not llm.scheduler.has_unfinished()          # nothing was half-queued
    out = llm.generate(prompts[:1], greedy(), use_tqdm=False)
    assert out[0].token_ids


def test_bad_engine_arguments():
    with pytest.raises(ValueError, match="unknown model"):
        minikv.LLM(model="gpt-17")
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        minikv.LLM(model=GEMMA4, kv_cache_dtype="int3")
    with pytest.raises(ValueError, match="unknown defect"):
        minikv.LLM(model=GEMMA4, reintroduce=("no-such-bug",))
    with pytest.raises(ValueError, match="backend"):
        minikv.LLM(model=GEMMA4, backend="cuda-graphs")


def test_pool_too_small_for_one_request_is_an_error_not_a_hang(prompts):
    llm = minikv.LLM(model=GEMMA4, num_blocks=1, max_num_seqs=2, backend="torch")
    with pytest.raises(ValueError, match="blocks"):
        llm.generate(prompts[:2], greedy(12), use_tqdm=False)


def test_t5_refuses_prompts_outside_its_domain():
    llm = minikv.LLM(model="tiny-t5", backend="torch", max_num_seqs=2)
    for outside, why in [("abc", "it has 3 characters"), ("x" * 41, "it has 41 characters")]:
        with pytest.raises(ValueError, match=f"outside tiny-t5's domain: 4..40 .*{why}"):
            llm.generate(["banana42", outside], use_tqdm=False)
    with pytest.raises(ValueError, match="alphabet"):
        llm.add_request("Banana42")
    assert not llm.has_unfinished()
    assert llm.generate(["banana42"], minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0].text == "24abn"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_matches_torch_backend(prompts):
    _, a = run(prompts, kv_cache_dtype="int8_per_token_head", device="cuda", backend="triton")
    _, b = run(prompts, kv_cache_dtype="int8_per_token_head", device="cuda", backend="torch")
    assert a == b


class _Seq:
    """What ModelRunner.prepare reads of a sequence."""

    def __init__(self, token_ids, block_table, num_cached_tokens):
        self.token_ids, self.block_table, self.num_cached_tokens = token_ids, block_table, num_cached_tokens

    def __len__(self):
        return len(self.token_ids)


@pytest.mark.parametrize("is_prefill", [True, False])
def test_prepare_gives_every_token_its_id_position_and_slot(is_prefill):
    """prepare's arrays, per sequence, against slot_of token by token: shuffled block tables, cached prefixes."""
    import random

    from minikv.cache.blocks import slot_of
    llm = minikv.LLM(model=GEMMA4, backend="torch")
    bs, rng = llm.config.cache.block_size, random.Random(0)
    seqs = [_Seq([rng.randrange(10) for _ in range(n)], rng.sample(range(40), -(-n // bs)), cached)
            for n, cached in ((37, 16), (5, 0), (64, 48), (1, 0))]
    ids, positions, md, _ = llm.runner.prepare(seqs, is_prefill)
    want = [(s.token_ids[p], p, slot_of(s.block_table, p, bs)) for s in seqs
            for p in range(s.num_cached_tokens if is_prefill else len(s) - 1, len(s))]
    assert list(zip(ids.tolist(), positions.tolist(), md.slot_mapping.tolist())) == want
    assert positions.dtype == md.slot_mapping.dtype == torch.int64
    seqs[0].block_table = seqs[0].block_table[:-1]             # a table too short for its tokens: no silent slot
    with pytest.raises(IndexError):
        llm.runner.prepare(seqs, is_prefill)
