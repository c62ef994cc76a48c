"""Prompts in vLLM's forms: a str, {"prompt": str}, {"prompt_token_ids": [...]}, a list of them; for tiny-t5 also
{"encoder_prompt": ..., "decoder_prompt": ...}. Each form gives the same tokens as its equivalent; a bad shape is a
TypeError naming the accepted forms, a bad value a ValueError; nothing is queued by a call that raises. A stop
string that starts inside a token of a BPE tokenizer is cut from the text (vLLM's behaviour)."""
from __future__ import annotations

import pytest

import minikv
from minikv.kernels.errors import InvalidTypeError, InvalidValueError

GREEDY = minikv.SamplingParams(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def gemma():
    return minikv.LLM(model="tiny-gemma4", backend="torch", max_num_seqs=4)


@pytest.fixture(scope="module")
def t5():
    return minikv.LLM(model="tiny-t5", backend="torch", max_num_seqs=4)


def ids_of(outs):
    return [o.token_ids for o in outs]


def test_decoder_only_forms_agree(gemma):
    tok = gemma.tokenizer
    prompts = ["3 7 11 15", "10 20 30"]
    as_str = gemma.generate(prompts, GREEDY, use_tqdm=False)
    as_text = gemma.generate([{"prompt": p} for p in prompts], GREEDY, use_tqdm=False)
    as_ids = gemma.generate([{"prompt_token_ids": [tok.bos_id, *tok.encode(p)]} for p in prompts], GREEDY,
                            use_tqdm=False)
    mixed = gemma.generate([prompts[0], {"prompt_token_ids": [tok.bos_id, *tok.encode(prompts[1])]}], GREEDY,
                           use_tqdm=False)
    assert ids_of(as_str) == ids_of(as_text) == ids_of(as_ids) == ids_of(mixed)
    assert as_ids[0].prompt is None and as_ids[0].prompt_token_ids == as_str[0].prompt_token_ids
    single = gemma.generate({"prompt": prompts[0]}, GREEDY, use_tqdm=False)
    assert len(single) == 1 and single[0].token_ids == as_str[0].token_ids
    rid = gemma.add_request({"prompt_token_ids": as_str[0].prompt_token_ids}, GREEDY)
    while gemma.has_unfinished():
        done = gemma.step().finished
    assert done[0].request_id == rid and done[0].token_ids == as_str[0].token_ids


BAD_SHAPES = [
    ("int", 5), ("bytes", b"3 7"), ("nested list", [["3 7"]]), ("unknown key", {"text": "3 7"}),
    ("extra key", {"prompt": "3 7", "seed": 1}), ("prompt not str", {"prompt": 5}),
    ("ids not a list", {"prompt_token_ids": "3 7"}), ("id not int", {"prompt_token_ids": [1, 2.0]}),
    ("pair on a decoder-only model", {"encoder_prompt": "3 7", "decoder_prompt": None}),
]


@pytest.mark.parametrize("case,prompt", BAD_SHAPES, ids=[c[0] for c in BAD_SHAPES])
def test_bad_shapes_are_type_errors_naming_the_forms(gemma, case, prompt):
    with pytest.raises(InvalidTypeError) as err:
        gemma.generate(["3 7", prompt] if case != "nested list" else prompt, GREEDY, use_tqdm=False)
    assert "prompt" in str(err.value)
    if case in ("int", "bytes", "unknown key", "extra key"):
        assert '{"prompt_token_ids": [int, ...]}' in str(err.value)
    assert not gemma.has_unfinished()


@pytest.mark.parametrize("prompt,message", [
    ({"prompt_token_ids": []}, "is empty"), ({"prompt_token_ids": [1, 10_000]}, "outside the model's vocabulary"),
    ({"prompt_token_ids": [1, 9, 9]}, "outside tiny-gemma4's domain|two or more"), ({"prompt": ""}, "empty prompt")])
def test_bad_values_are_value_errors(gemma, prompt, message):
    with pytest.raises(InvalidValueError, match=message):
        gemma.generate(["3 7", prompt], GREEDY, use_tqdm=False)
    assert not gemma.has_unfinished()


def test_encoder_decoder_forms(t5):
    tok = t5.tokenizer
    prompts = minikv.tasks.for_model("tiny-t5").prompts(2, seed=0)
    params = minikv.SamplingParams(temperature=0, max_tokens=8)
    plain = t5.generate(prompts, params, use_tqdm=False)
    pairs = t5.generate([{"encoder_prompt": p, "decoder_prompt": None} for p in prompts], params, use_tqdm=False)
    ids = t5.generate([{"encoder_prompt": {"prompt_token_ids": tok.encode(p)}} for p in prompts], params,
                      use_tqdm=False)
    assert ids_of(plain) == ids_of(pairs) == ids_of(ids)
    assert plain[0].encoder_prompt == prompts[0] and plain[0].prompt is None
    assert plain[0].encoder_prompt_token_ids == tok.encode(prompts[0])
    # A decoder prompt is a forced prefix: starting from the first 3 greedy tokens, greedy continues the same way.
    head = plain[0].token_ids[:3]
    forced = t5.generate({"encoder_prompt": prompts[0], "decoder_prompt": {"prompt_token_ids": head}},
                         minikv.SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert head + forced.token_ids == plain[0].token_ids[:8]
    text = t5.generate({"encoder_prompt": prompts[0], "decoder_prompt": tok.decode(head)},
                       minikv.SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert text.token_ids == forced.token_ids and text.prompt == tok.decode(head)
    with pytest.raises(InvalidTypeError, match="unknown keys"):
        t5.generate({"encoder_prompt": prompts[0], "prompt": "x"}, params, use_tqdm=False)
    assert t5.cross_blocks_needed([{"encoder_prompt": prompts[0]}, prompts[1]]) == t5.cross_blocks_needed(prompts)


def test_stop_string_starting_inside_a_token_is_cut(tmp_path):
    pytest.importorskip("transformers", reason="the random checkpoint is written by transformers")
    from tools import random_checkpoints
    path = random_checkpoints.write("gemma4", tmp_path / "ckpt", randomize=True)
    llm = minikv.LLM(model=str(path), backend="torch", max_num_seqs=2)
    tok = llm.tokenizer
    greedy = dict(temperature=0, max_tokens=12, ignore_eos=True)
    full = llm.generate("3 7 11 15", minikv.SamplingParams(**greedy), use_tqdm=False)[0]
    text = full.text
    # A stop string that begins in the middle of a multi-character token and occurs first there.
    start, at = 0, None
    for t in full.token_ids:
        piece = tok.decode([t])
        if len(piece) >= 2 and text.find(text[start + 1:start + 3]) == start + 1 and start + 3 <= len(text):
            at = start + 1
            break
        start += len(piece)
    assert at is not None, f"no multi-character token to stop inside in {text!r}"
    stop = text[at:at + 2]
    out = llm.generate("3 7 11 15", minikv.SamplingParams(stop=stop, **greedy), use_tqdm=False)[0].outputs[0]
    assert out.text == text[:at] and out.finish_reason == "stop" and out.stop_reason == stop
    assert tok.decode(out.token_ids).startswith(text[:at + 2])          # token_ids keep the token holding it
    kept = llm.generate("3 7 11 15", minikv.SamplingParams(stop=[stop], include_stop_str_in_output=True, **greedy),
                        use_tqdm=False)[0]
    assert kept.text == text[:at + 2]


def test_a_refused_request_leaves_the_others_served(gemma):
    rid = gemma.add_request("3 7 11 15", GREEDY)
    gemma.step()                                                    # the first request is running
    for bad in ({"prompt_token_ids": [1, 10_000]}, {"text": "3 7"}, "3 7 A"):
        with pytest.raises((InvalidTypeError, InvalidValueError)):
            gemma.add_request(bad, GREEDY)
    done = []
    while gemma.has_unfinished():
        done += gemma.step().finished
    assert [d.request_id for d in done] == [rid] and done[0].text == " 19 23"
