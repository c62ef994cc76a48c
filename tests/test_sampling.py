"""Sampling as vLLM does it: SamplingParams' names, defaults and typed errors; top-k / top-p / min-p filtering
against a plain reference written here; seeded, batch-independent draws; n completions; logprobs; stop strings
and stop token ids; the outputs' vLLM shape (backend="torch": the kernels are not the point)."""
from __future__ import annotations

import math

import pytest
import torch

import minikv
from minikv.engine import sampler
from minikv.kernels.errors import InvalidTypeError, InvalidValueError

PROMPTS = ["3 7 11 15", "10 20 30", "2 4 6 8"]


@pytest.fixture(scope="module")
def llm():
    return minikv.LLM(model="tiny-gemma4", backend="torch", max_num_seqs=4)


def texts(llm, prompts, **sp):
    return [o.text for o in llm.generate(prompts, minikv.SamplingParams(**sp), use_tqdm=False)]


# ---- SamplingParams -------------------------------------------------------------------------------------------
def test_defaults_are_vllms():
    p = minikv.SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.n, p.max_tokens) == (1.0, 1.0, 0, 0.0, 1, 16)
    assert (p.seed, p.stop, p.stop_token_ids, p.logprobs, p.ignore_eos, p.include_stop_str_in_output) == \
        (None, None, None, None, False, False)


BAD = [  # (keywords, error class, a fragment of the message that names the fix)
    (dict(top_p=0), InvalidValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), InvalidValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p="0.9"), InvalidTypeError, "top_p must be a number"),
    (dict(top_k=-2), InvalidValueError, "top_k must be 0 or -1 .every token. or at least 1"),
    (dict(top_k=2.0), InvalidTypeError, "top_k must be an int"),
    (dict(min_p=-0.1), InvalidValueError, r"min_p must be in \[0, 1\]"),
    (dict(min_p=None), InvalidTypeError, "min_p must be a number"),
    (dict(n=0), InvalidValueError, "n must be between 1 and"),
    (dict(n=True), InvalidTypeError, "n must be an int"),
    (dict(logprobs=-1), InvalidValueError, "logprobs must be between 0"),
    (dict(logprobs=100), InvalidValueError, "logprobs must be between 0"),
    (dict(logprobs=1.0), InvalidTypeError, "logprobs must be an int or None"),
    (dict(stop_token_ids=[-1]), InvalidValueError, "stop_token_ids must be token ids"),
    (dict(stop_token_ids=5), InvalidTypeError, "stop_token_ids must be a list of int"),
    (dict(include_stop_str_in_output="yes"), InvalidTypeError, "include_stop_str_in_output must be True or False"),
    (dict(temperature=-1), InvalidValueError, "temperature must be 0 .greedy. or between"),
    (dict(max_tokens=0), InvalidValueError, "max_tokens must be at least 1"),
]


@pytest.mark.parametrize("kw,error,message", BAD, ids=[str(b[0]) for b in BAD])
def test_bad_values_raise_typed_errors_that_name_the_fix(kw, error, message):
    with pytest.raises(error, match=message):
        minikv.SamplingParams(**kw)


def test_stop_takes_one_string_or_a_list():
    assert minikv.SamplingParams(stop="\n").stop == ("\n",)
    assert minikv.SamplingParams(stop=["a", "b"], stop_token_ids=[3]).stop_token_ids == (3,)


# ---- the filters against a plain reference --------------------------------------------------------------------
def reference_kept(logits: list[float], temperature: float, top_k: int, top_p: float, min_p: float) -> set[int]:
    """The token ids vLLM's sampler may draw: temperature, then min_p, top_k, top_p, each on what is left."""
    scaled = [x / temperature for x in logits]
    kept = set(range(len(scaled)))

    def probs():
        z = sum(math.exp(scaled[i]) for i in kept)
        return {i: math.exp(scaled[i]) / z for i in kept}

    if min_p > 0:
        p = probs()
        kept = {i for i in kept if p[i] >= min_p * max(p.values())}
    if top_k > 0:
        kept = set(sorted(kept, key=lambda i: -scaled[i])[:top_k])
    if top_p < 1:
        p, total, nucleus = probs(), 0.0, set()
        for i in sorted(kept, key=lambda i: -scaled[i]):
            if total >= top_p:
                break
            nucleus.add(i)
            total += p[i]
        kept = nucleus
    return kept


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.1), (0.5, 10, 0.9, 0.05),
    (2.0, 3, 0.5, 0.0), (1.0, -1, 0.95, 0.2), (1.0, 1, 1.0, 0.0)])
def test_filters_match_a_plain_reference(temperature, top_k, top_p, min_p):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(64, generator=g, dtype=torch.float64) * 3
        out = sampler.filter_logits(logits, temperature, top_k, top_p, min_p)
        kept = {i for i in range(64) if math.isfinite(out[i])}
        assert kept == reference_kept(logits.tolist(), temperature, top_k, top_p, min_p)
        assert torch.equal(out[sorted(kept)], logits[sorted(kept)] / temperature)


def test_token_logprobs_hold_the_top_k_and_the_sampled_token():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    logp = torch.log_softmax(logits, dim=-1)
    got = sampler.token_logprobs(logits, token=0, k=2)
    assert {t: r for t, (_, r) in got.items()} == {1: 1, 3: 2, 0: 4}
    assert all(math.isclose(v, float(logp[t]), rel_tol=1e-6) for t, (v, _) in got.items())
    assert sampler.token_logprobs(logits, token=2, k=0) == {2: (float(logp[2]), 3)}


# ---- through the engine -----------------------------------------------------------------------------------------
def test_greedy_is_the_argmax_and_top_k_1_samples_it(llm):
    greedy = texts(llm, PROMPTS, temperature=0, max_tokens=8)
    assert texts(llm, PROMPTS, temperature=5.0, top_k=1, max_tokens=8, seed=1) == greedy
    task = minikv.tasks.for_model("tiny-gemma4")
    assert all(task.check(p, t) for p, t in zip(PROMPTS, greedy))


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(llm):
    hot = dict(temperature=5.0, max_tokens=8, seed=7)
    alone = texts(llm, PROMPTS[:1], **hot)
    batched = texts(llm, PROMPTS, **hot)
    again = texts(minikv.LLM(model="tiny-gemma4", backend="torch", max_num_seqs=2), PROMPTS, **hot)
    assert batched[0] == alone[0] and batched == again
    other_seeds = {texts(llm, PROMPTS[:1], temperature=5.0, max_tokens=8, seed=s)[0] for s in range(6)}
    assert len(other_seeds) > 1                                # the seed decides the draws


def test_unseeded_sampling_derives_from_the_engine_seed_and_request_index():
    def run(seed):
        eng = minikv.LLM(model="tiny-gemma4", backend="torch", max_num_seqs=4, seed=seed)
        return texts(eng, PROMPTS, temperature=5.0, max_tokens=8)
    first = run(0)
    assert run(0) == first and run(1) != first


def test_n_completions_each_draw_from_seed_plus_index(llm):
    out = llm.generate(PROMPTS[0], minikv.SamplingParams(n=4, temperature=5.0, max_tokens=8, seed=3),
                       use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3] and out.finished
    for c in out.outputs:
        assert c.text == texts(llm, PROMPTS[0], temperature=5.0, max_tokens=8, seed=3 + c.index)[0]
    assert len({c.text for c in out.outputs}) > 1
    assert out.text == out.outputs[0].text and out.token_ids == out.outputs[0].token_ids    # the aliases


def test_n_greedy_and_request_ids(llm):
    outs = llm.generate(PROMPTS[:2], [minikv.SamplingParams(temperature=0, n=2, max_tokens=4),
                                      minikv.SamplingParams(temperature=0, max_tokens=4)], use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [2, 1] and outs[1].request_id == outs[0].request_id + 2
    assert outs[0].outputs[0].token_ids == outs[0].outputs[1].token_ids
    assert not llm.has_unfinished()


def test_logprobs_shape_and_cumulative(llm):
    out = llm.generate(PROMPTS[0], minikv.SamplingParams(temperature=0, max_tokens=6, logprobs=3),
                       use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 6
    for token, step in zip(out.token_ids, out.logprobs):
        assert len(step) == 3 and step[token].rank == 1                 # greedy: the sampled token is the top one
        assert sorted(lp.rank for lp in step.values()) == [1, 2, 3]
        assert step[token].decoded_token == llm.tokenizer.decode([token])
        assert all(lp.logprob <= 0 for lp in step.values())
    assert math.isclose(out.cumulative_logprob, sum(s[t].logprob for t, s in zip(out.token_ids, out.logprobs)))
    plain = llm.generate(PROMPTS[0], minikv.SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None
    assert plain.token_ids == out.token_ids


def test_stop_token_ids_end_the_completion(llm):
    full = llm.generate(PROMPTS[0], minikv.SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0]
    stop = full.token_ids[3]
    first = full.token_ids.index(stop)
    out = llm.generate(PROMPTS[0], minikv.SamplingParams(temperature=0, max_tokens=8, stop_token_ids=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert out.token_ids == full.token_ids[:first] and out.finish_reason == "stop" and out.stop_reason == stop
    assert full.finish_reason == "length" and full.outputs[0].stop_reason is None


def test_request_output_fields(llm):
    out = llm.generate(PROMPTS[0], minikv.SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    tok = llm.tokenizer
    assert out.prompt == PROMPTS[0] and out.prompt_token_ids == [tok.bos_id, *tok.encode(PROMPTS[0])]
    assert isinstance(out.outputs[0], minikv.CompletionOutput) and out.outputs[0].finished()
    assert tok.decode(out.outputs[0].token_ids) == out.outputs[0].text


def test_the_hunter_sees_the_logits_the_sampler_gets():
    # minikv.hunt's matches-reference compares these rows with the dense model's; without them it checks tokens only.
    from minikv.hunt import seams
    eng = minikv.LLM(model="tiny-gemma4", backend="torch", max_num_seqs=2)
    store = {}
    assert seams.record_logits(eng, store)
    outs = eng.generate(PROMPTS[:2], minikv.SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert {rid: len(rows) for rid, rows in store.items()} == {o.request_id: 3 for o in outs}
    assert all(int(rows[0].argmax()) == o.token_ids[0] for o, rows in zip(outs, store.values()))


def test_detokenize_false_gives_the_same_ids_and_no_text(llm):
    """vLLM's detokenize=False: token ids only (what a benchmark on ids the tokenizer cannot write needs)."""
    kw = {"temperature": 0, "max_tokens": 5, "logprobs": 2}
    with_text, ids_only = (llm.generate(["389 391 393"], minikv.SamplingParams(**kw, detokenize=d), use_tqdm=False)[0]
                           for d in (True, False))
    assert ids_only.outputs[0].token_ids == with_text.outputs[0].token_ids and with_text.outputs[0].text
    assert ids_only.outputs[0].text == ""
    assert all(lp.decoded_token is None for step in ids_only.outputs[0].logprobs for lp in step.values())
    with pytest.raises(InvalidValueError, match="detokenize"):
        minikv.SamplingParams(stop=["9"], detokenize=False)
    with pytest.raises(InvalidTypeError, match="detokenize"):
        minikv.SamplingParams(detokenize="no")
