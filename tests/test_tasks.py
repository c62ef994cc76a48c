"""The tasks: deterministic held-out prompts of exact token lengths, and the right/wrong checks."""
from __future__ import annotations

import pytest

from minikv import tasks
from minikv.models import registry

ARITH = tasks.for_model("tiny-kvshare")
REVERSE = tasks.for_model("tiny-encdec")
TOK = registry.get_tokenizer("tiny-kvshare")


def test_for_model():
    assert isinstance(ARITH, tasks.ArithmeticTask) and isinstance(REVERSE, tasks.ReverseTask)
    assert ARITH.default_max_tokens == 12
    with pytest.raises(ValueError, match="known models: tiny-kvshare, tiny-encdec"):
        tasks.for_model("tiny-gpt")


@pytest.mark.parametrize("task", [ARITH, REVERSE], ids=["arith", "reverse"])
def test_prompts_are_deterministic_and_held_out(task):
    first = task.prompts(40, seed=0)
    assert first == task.prompts(40, seed=0)
    assert first != task.prompts(40, seed=1)
    assert task.prompts(10, seed=0) == first[:10]
    assert task.prompts(0) == []
    for prompt in first:
        TOK.encode(prompt)                                  # only characters the tokenizer knows
        if task is ARITH:
            terms = [int(t) for t in prompt.split(" ")]
            assert ARITH.is_held_out(terms[0], terms[1] - terms[0])
            assert 2 <= len(terms) <= tasks.ARITHMETIC_MAX_TERMS
        else:
            assert REVERSE.is_held_out(prompt)
            assert tasks.REVERSE_MIN_LEN <= len(prompt) <= tasks.REVERSE_MAX_LEN


def test_training_pairs_never_overlap_prompts():
    assert not set(ARITH.training_pairs) & set(ARITH.heldout_pairs)
    assert len(ARITH.heldout_pairs) > 50


@pytest.mark.parametrize("num_tokens", [4, 5, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 96])
def test_arithmetic_prompts_have_exact_token_length(num_tokens):
    prompts = ARITH.prompts(6, seed=2, num_tokens=num_tokens)
    assert len(prompts) == 6
    for prompt in prompts:
        assert len([TOK.bos_id] + TOK.encode(prompt)) == num_tokens
        ARITH.expected(prompt, 12)                          # whole terms, a valid sequence


@pytest.mark.parametrize("num_tokens", [4, 15, 16, 17, 33, 40])
def test_reverse_prompts_have_exact_token_length(num_tokens):
    for prompt in REVERSE.prompts(5, seed=2, num_tokens=num_tokens):
        assert len(TOK.encode(prompt)) == num_tokens


@pytest.mark.parametrize("task,bad", [(ARITH, 3), (ARITH, 97), (REVERSE, 3), (REVERSE, 41)])
def test_num_tokens_out_of_range(task, bad):
    with pytest.raises(ValueError, match="num_tokens must be in"):
        task.prompts(2, num_tokens=bad)


def test_arithmetic_expected():
    assert ARITH.expected("3 7 11 15", 12) == " 19 23 27 31"
    assert ARITH.expected("10 20 30", 8) == " 40 50 6"
    assert ARITH.expected("98 99", 9) == " 100 101 "
    for bad in ["", "5", "1  2", "1 2 4", "a b", "-1 2", "1 2 "]:
        with pytest.raises(ValueError):
            ARITH.expected(bad, 5)
    with pytest.raises(ValueError, match="negative"):
        ARITH.expected("5 3", 10)


@pytest.mark.parametrize("text,ok", [
    (" 19 23 27 31", True),
    (" 19 23 2", True),          # cut by max_tokens inside a number: a prefix of the right one
    (" 19 23 ", True),
    (" 1", True),
    (" 19 24 27 31", False),     # a wrong complete number
    (" 19 23 28", False),        # a wrong trailing partial number
    (" 19 23 27 311", False),    # a number that runs on
    ("19 23 27 31", False),      # missing the separating space
    ("", False),
    (" 19  23", False),
])
def test_arithmetic_check(text, ok):
    assert ARITH.check("3 7 11 15", text) is ok


def test_reverse_expected_and_check():
    assert REVERSE.expected("ab12", 4) == "21ba"
    assert REVERSE.expected("ab12", 2) == "21"
    assert REVERSE.check("ab12", "21ba")
    for wrong in ["21b", "21bA", "21ba1", "", "12ab"]:
        assert not REVERSE.check("ab12", wrong)
    with pytest.raises(ValueError):
        REVERSE.expected("AB", 2)


def test_max_tokens_covers_the_answer():
    prompt = ARITH.prompts(1)[0]
    assert ARITH.max_tokens(prompt) == ARITH.default_max_tokens == 12
    assert REVERSE.max_tokens("ab12") == 5                   # four characters + EOS
    assert all(REVERSE.max_tokens(p) <= REVERSE.default_max_tokens for p in REVERSE.prompts(20))
