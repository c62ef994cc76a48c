"""The tasks the tiny models were trained on: every output is objectively right or wrong.

* tiny-kvshare continues arithmetic sequences: "3 7 11 15" -> " 19 23 27 31 ...".
* tiny-encdec reverses a string of digits and lowercase letters: "ab12" -> "21ba" (then EOS).

Prompts from `prompts()` are held out from training by construction: each task splits its inputs with a fixed
hash, training draws only from one side and `prompts()` only from the other.

    task = for_model("tiny-kvshare")
    prompts = task.prompts(n=48, seed=0)              # deterministic
    task.check(prompts[0], generated_text)             # True when the output is right
"""
from __future__ import annotations

import random
import zlib
from itertools import pairwise

ARITHMETIC_MAX_START = 99
ARITHMETIC_DIFFS = tuple(range(1, 21))
ARITHMETIC_MAX_TERMS = 20
REVERSE_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
REVERSE_MIN_LEN, REVERSE_MAX_LEN = 4, 40


def _held_out(key: str, one_in: int) -> bool:
    return zlib.crc32(key.encode()) % one_in == 0


class ArithmeticTask:
    """Continue an increasing arithmetic sequence of non-negative integers written in decimal, space-separated.

    Prompts start at 0..99, step by 1..20 and hold 2..20 terms. A prompt's length in tokens, as the engine feeds
    it, is 1 (BOS) + its number of characters. One (start, step) pair in eight is held out for `prompts()`.
    """

    name = "arithmetic"
    model = "tiny-kvshare"
    default_max_tokens = 12
    min_prompt_tokens = 4              # [BOS] "a b"
    max_prompt_tokens = 96

    def max_tokens(self, prompt: str) -> int:
        """How many new tokens to ask for: the task's default continuation length."""
        return self.default_max_tokens

    def __init__(self):
        pairs = [(a, d) for a in range(ARITHMETIC_MAX_START + 1) for d in ARITHMETIC_DIFFS]
        self.heldout_pairs = [p for p in pairs if self.is_held_out(*p)]
        self.training_pairs = [p for p in pairs if not self.is_held_out(*p)]

    @staticmethod
    def is_held_out(start: int, step: int) -> bool:
        return _held_out(f"arith:{start},{step}", 8)

    @staticmethod
    def sequence_text(start: int, step: int, num_chars: int) -> str:
        """The sequence start, start+step, ... written out, at least `num_chars` characters long."""
        parts, value, length = [], start, -1
        while length < num_chars:
            parts.append(str(value))
            length += len(parts[-1]) + 1
            value += step
        return " ".join(parts)

    def prompts(self, n: int, seed: int = 0, num_tokens: int | None = None) -> list[str]:
        """`n` held-out prompts; with `num_tokens`, each is exactly that many tokens long including BOS."""
        _check_count(n)
        if num_tokens is not None and not self.min_prompt_tokens <= num_tokens <= self.max_prompt_tokens:
            raise ValueError(f"num_tokens must be in [{self.min_prompt_tokens}, {self.max_prompt_tokens}] "
                             f"for {self.name} prompts, got {num_tokens}")
        rng = random.Random(f"{self.name}:{seed}:{num_tokens}")
        out = []
        for _ in range(1000 * (n + 1)):
            if len(out) == n:
                return out
            start, step = rng.choice(self.heldout_pairs)
            if num_tokens is None:
                terms = rng.randint(2, ARITHMETIC_MAX_TERMS)
                out.append(" ".join(str(start + i * step) for i in range(terms)))
                continue
            chars = num_tokens - 1
            text = self.sequence_text(start, step, chars)
            if (len(text) == chars or text[chars] == " ") and " " in text[:chars]:
                out.append(text[:chars])          # whole terms only, at least two of them
        raise ValueError(f"could not build {n} held-out prompts of {num_tokens} tokens")

    @staticmethod
    def _parse(prompt: str) -> list[int]:
        parts = prompt.split(" ")
        if len(parts) < 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"an arithmetic prompt is two or more non-negative integers separated by single "
                             f"spaces, got {prompt!r}")
        return [int(p) for p in parts]

    def expected(self, prompt: str, num_chars: int) -> str:
        """The first `num_chars` characters of the right continuation (it starts with a space)."""
        terms = self._parse(prompt)
        step = terms[1] - terms[0]
        if any(b - a != step for a, b in pairwise(terms)):
            raise ValueError(f"{prompt!r} is not an arithmetic sequence")
        text, value = "", terms[-1]
        while len(text) < num_chars:
            value += step
            if value < 0:
                raise ValueError(f"the continuation of {prompt!r} turns negative")
            text += f" {value}"
        return text[:num_chars]

    def check(self, prompt: str, text: str) -> bool:
        """True when `text` is the right continuation, possibly cut short (a trailing partial number is fine)."""
        return len(text) > 0 and text == self.expected(prompt, len(text))


class ReverseTask:
    """Reverse a string of 4..40 digits and lowercase letters. The answer is the reversed string, then EOS.

    The encoder's input is the prompt's characters (no specials); `num_tokens` is therefore the prompt length.
    One string in eight (by hash) is held out for `prompts()`.
    """

    name = "reverse"
    model = "tiny-encdec"
    default_max_tokens = 48            # the longest answer is 40 characters + EOS
    min_prompt_tokens = REVERSE_MIN_LEN
    max_prompt_tokens = REVERSE_MAX_LEN

    def max_tokens(self, prompt: str) -> int:
        """The reversed prompt plus EOS."""
        return len(prompt) + 1

    @staticmethod
    def is_held_out(text: str) -> bool:
        return _held_out(f"reverse:{text}", 8)

    @staticmethod
    def random_string(rng: random.Random, length: int) -> str:
        return "".join(rng.choice(REVERSE_ALPHABET) for _ in range(length))

    def prompts(self, n: int, seed: int = 0, num_tokens: int | None = None) -> list[str]:
        _check_count(n)
        if num_tokens is not None and not REVERSE_MIN_LEN <= num_tokens <= REVERSE_MAX_LEN:
            raise ValueError(f"num_tokens must be in [{REVERSE_MIN_LEN}, {REVERSE_MAX_LEN}] for {self.name} "
                             f"prompts, got {num_tokens}")
        rng = random.Random(f"{self.name}:{seed}:{num_tokens}")
        out = []
        while len(out) < n:
            length = num_tokens if num_tokens is not None else rng.randint(REVERSE_MIN_LEN, REVERSE_MAX_LEN)
            text = self.random_string(rng, length)
            if self.is_held_out(text):
                out.append(text)
        return out

    def expected(self, prompt: str, num_chars: int) -> str:
        if not prompt or any(ch not in REVERSE_ALPHABET for ch in prompt):
            raise ValueError(f"a reverse prompt is a non-empty string of digits and lowercase letters, "
                             f"got {prompt!r}")
        return prompt[::-1][:num_chars]

    def check(self, prompt: str, text: str) -> bool:
        """True when `text` is the whole reversed prompt (the model must also have stopped: no prefix credit)."""
        return text == self.expected(prompt, len(prompt))


def _check_count(n: int) -> None:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")


Task = ArithmeticTask | ReverseTask
_TASKS = {"tiny-kvshare": ArithmeticTask, "tiny-encdec": ReverseTask}


def for_model(name: str) -> Task:
    """The task model `name` was trained on."""
    if name not in _TASKS:
        raise ValueError(f"no task for model {name!r}; known models: {', '.join(_TASKS)}")
    return _TASKS[name]()
