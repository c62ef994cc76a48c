"""The tasks: deterministic held-out prompts of exact token lengths, and the right/wrong checks.

The domains' bounds and the held-out split by sequence family: tests/test_trained_models.py."""
from __future__ import annotations

import pytest

from minikv import tasks
from minikv.models import registry

ARITH = tasks.for_model("tiny-gemma4")
SORT = tasks.for_model("tiny-t5")
ARITH_TOK = registry.get_tokenizer("tiny-gemma4")
SORT_TOK = registry.get_tokenizer("tiny-t5")


def test_for_model():
    assert isinstance(ARITH, tasks.WindowArithmeticTask) and isinstance(SORT, tasks.SortDistinctTask)
    assert ARITH.default_max_tokens == 12
    with pytest.raises(ValueError, match="known models: tiny-gemma4, tiny-t5"):
        tasks.for_model("tiny-gpt")


@pytest.mark.parametrize("task", [ARITH, SORT], ids=["arith", "sort"])
def test_prompts_are_deterministic_held_out_and_in_the_domain(task):
    first = task.prompts(40, seed=0)
    assert first == task.prompts(40, seed=0)
    assert first != task.prompts(40, seed=1)
    assert task.prompts(10, seed=0) == first[:10]
    assert task.prompts(0) == []
    for prompt in first:
        task.validate(prompt)
        if task is ARITH:
            ARITH_TOK.encode(prompt)
            terms = [int(t) for t in prompt.split(" ")]
            assert ARITH.is_held_out(terms[0], terms[1] - terms[0])
            assert 2 <= len(terms) <= tasks.WINDOW_MAX_TERMS
        else:
            SORT_TOK.encode(prompt)
            assert SORT.is_held_out(prompt)
            assert tasks.SORT_MIN_LEN <= len(prompt) <= tasks.SORT_MAX_LEN


@pytest.mark.parametrize("num_tokens", [4, 5, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 96])
def test_arithmetic_prompts_have_exact_token_length(num_tokens):
    prompts = ARITH.prompts(6, seed=2, num_tokens=num_tokens)
    assert len(prompts) == 6
    for prompt in prompts:
        assert len([ARITH_TOK.bos_id] + ARITH_TOK.encode(prompt)) == num_tokens
        ARITH.expected(prompt, 12)                          # whole terms, a valid sequence


@pytest.mark.parametrize("num_tokens", [4, 15, 16, 17, 33, 40])
def test_sort_prompts_have_exact_token_length(num_tokens):
    for prompt in SORT.prompts(5, seed=2, num_tokens=num_tokens):
        assert len(SORT_TOK.encode(prompt)) == num_tokens


@pytest.mark.parametrize("task,bad", [(ARITH, 3), (ARITH, 97), (SORT, 3), (SORT, 41)])
def test_num_tokens_out_of_range(task, bad):
    with pytest.raises(ValueError, match="num_tokens must be in"):
        task.prompts(2, num_tokens=bad)


def test_arithmetic_expected():
    assert ARITH.expected("3 7 11 15", 12) == " 19 23 27 31"
    assert ARITH.expected("10 20 30", 8) == " 40 50 6"
    assert ARITH.expected("98 99", 9) == " 100 101 "
    for bad in ["", "5", "1  2", "1 2 4", "a b", "-1 2", "1 2 ", "5 3"]:
        with pytest.raises(ValueError):
            ARITH.expected(bad, 5)


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


def test_sort_expected_and_check():
    assert SORT.expected("ab12", 4) == "12ab"
    assert SORT.expected("banana42", 3) == "24a"
    assert SORT.check("banana42", "24abn")
    for wrong in ["24ab", "24abN", "24abnn", "", "abn24"]:
        assert not SORT.check("banana42", wrong)
    for bad in ["AB12", "ab1", "a" * 41, "ab 12"]:
        with pytest.raises(ValueError, match="outside tiny-t5's domain"):
            SORT.expected(bad, 2)


def test_max_tokens_covers_the_answer():
    prompt = ARITH.prompts(1)[0]
    assert ARITH.max_tokens(prompt) == ARITH.default_max_tokens == 12
    assert SORT.max_tokens("abba12") == 5                   # four distinct characters + EOS
    assert all(SORT.max_tokens(p) <= SORT.default_max_tokens for p in SORT.prompts(20))
