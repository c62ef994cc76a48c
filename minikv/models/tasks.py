"""The tasks the tiny models were trained on: every output is objectively right or wrong.
See docs/internals.md#models-tasks."""
from __future__ import annotations

import math
import random
import re
import zlib
from itertools import pairwise

from minikv.kernels.errors import InvalidTypeError, InvalidValueError

SORT_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
SORT_MIN_LEN, SORT_MAX_LEN = 4, 40
# tiny-gemma4's domain (see WindowArithmeticTask)
WINDOW_MAX_FIRST, WINDOW_MAX_STEP, WINDOW_MAX_TERMS = 999, 99, 20


def _held_out(key: str, one_in: int) -> bool:
    return zlib.crc32(key.encode()) % one_in == 0


class WindowArithmeticTask:
    """Continue any window of an increasing arithmetic sequence of non-negative integers (tiny-gemma4)."""

    name = "arithmetic-window"
    default_max_tokens = 12
    min_prompt_tokens = 4              # [BOS] "a b"
    max_prompt_tokens = 96

    def __init__(self, max_first: int = None, max_step: int = None, max_terms: int = None,
                 model: str = "tiny-gemma4"):
        self.model = model
        self.max_first = WINDOW_MAX_FIRST if max_first is None else max_first
        self.max_step = WINDOW_MAX_STEP if max_step is None else max_step
        self.max_terms = WINDOW_MAX_TERMS if max_terms is None else max_terms

    def max_tokens(self, prompt: str) -> int:
        return self.default_max_tokens

    @staticmethod
    def is_held_out(first: int, step: int) -> bool:
        residue = first % step
        return step >= 2 and residue != 0 and _held_out(f"window:{step},{residue}", 8)

    def _in_domain(self, first: int, step: int, terms: int) -> bool:
        return (0 <= first <= self.max_first and 1 <= step <= self.max_step and 2 <= terms <= self.max_terms
                and len(self.prompt_text(first, step, terms)) <= self.max_prompt_tokens - 1)

    @staticmethod
    def sequence_text(first: int, step: int, num_chars: int) -> str:
        """The sequence first, first+step, ... written out, at least `num_chars` characters long."""
        parts, value, length = [], first, -1
        while length < num_chars:
            parts.append(str(value))
            length += len(parts[-1]) + 1
            value += step
        return " ".join(parts)

    @staticmethod
    def prompt_text(first: int, step: int, terms: int) -> str:
        return " ".join(str(first + i * step) for i in range(terms))

    def training_start(self, rng: random.Random, small_share: float = 0.0) -> tuple[int, int]:
        """A (first term, step) from the training side of the domain."""
        while True:
            if rng.random() < small_share:
                first = min(self.max_first, int(10 ** rng.uniform(0, math.log10(self.max_first + 1))) - 1)
                step = min(self.max_step, int(10 ** rng.uniform(0, math.log10(self.max_step + 1))))
            else:
                first, step = rng.randint(0, self.max_first), rng.randint(1, self.max_step)
            if not self.is_held_out(first, step):
                return first, step

    def small_number_prompts(self, n: int, seed: int = 0, max_first: int = 30, max_step: int = 10) -> list[str]:
        """`n` prompts of small numbers (first term <= max_first, step <= max_step, 2..max_terms terms), from the
        whole domain (held-out and training families): what a user tries first. Reported next to `prompts()`."""
        rng = random.Random(f"{self.name}:small:{seed}")
        out = []
        while len(out) < n:
            first, step = rng.randint(0, max_first), rng.randint(1, max_step)
            terms = rng.randint(2, self.max_terms)
            if self._in_domain(first, step, terms):
                out.append(self.prompt_text(first, step, terms))
        return out

    def sample(self, rng: random.Random, held_out: bool | None = True) -> str:
        """One prompt uniformly from the domain (held_out=True: its held-out part; None: all of it)."""
        while True:
            first, step = rng.randint(0, self.max_first), rng.randint(1, self.max_step)
            terms = rng.randint(2, self.max_terms)
            if (held_out is None or self.is_held_out(first, step) == held_out) and \
                    self._in_domain(first, step, terms):
                return self.prompt_text(first, step, terms)

    def prompts(self, n: int, seed: int = 0, num_tokens: int | None = None) -> list[str]:
        """`n` held-out prompts, uniform over the held-out part of the domain; with `num_tokens`, each is exactly
        that many tokens long including BOS (uniform over the held-out prompts of that length)."""
        _check_prompt_request(self.name, n, num_tokens, self.min_prompt_tokens, self.max_prompt_tokens)
        rng = random.Random(f"{self.name}:{seed}:{num_tokens}")
        out = []
        for _ in range(100_000 * (n + 1)):
            if len(out) == n:
                return out
            prompt = self.sample(rng)
            if num_tokens is None or len(prompt) == num_tokens - 1:
                out.append(prompt)
        raise InvalidValueError(f"could not build {n} held-out prompts of {num_tokens} tokens")

    def validate(self, prompt: str) -> tuple[int, int, int]:
        """(first term, step, number of terms) of a prompt in the domain; ValueError saying why otherwise."""
        if not isinstance(prompt, str):
            raise InvalidTypeError(f"an arithmetic prompt is a str, got {type(prompt).__name__}")
        parts = prompt.split(" ")
        if len(parts) < 2 or not all(p.isdigit() and (p == "0" or p[0] != "0") for p in parts):
            raise InvalidValueError(f"an arithmetic prompt is two or more non-negative integers (no leading zeros) "
                                    f"separated by single spaces, got {prompt!r}")
        terms = [int(p) for p in parts]
        step = terms[1] - terms[0]
        if any(b - a != step for a, b in pairwise(terms)):
            raise InvalidValueError(f"{prompt!r} is not an arithmetic sequence")
        if not self._in_domain(terms[0], step, len(terms)):
            raise InvalidValueError(
                f"{prompt!r} is outside {self.model}'s domain: first term 0..{self.max_first}, step "
                f"1..{self.max_step}, 2..{self.max_terms} terms, at most {self.max_prompt_tokens - 1} characters "
                f"(got first term {terms[0]}, step {step}, {len(terms)} terms, {len(prompt)} characters)")
        return terms[0], step, len(terms)

    def expected(self, prompt: str, num_chars: int) -> str:
        """The first `num_chars` characters of the right continuation (it starts with a space)."""
        first, step, terms = self.validate(prompt)
        text, value = "", first + (terms - 1) * step
        while len(text) < num_chars:
            value += step
            text += f" {value}"
        return text[:num_chars]

    def check(self, prompt: str, text: str) -> bool:
        """True when `text` is the right continuation, possibly cut short (a trailing partial number is fine)."""
        return len(text) > 0 and text == self.expected(prompt, len(text))


def _check_count(n: int) -> None:
    if not isinstance(n, int) or n < 0:
        raise InvalidValueError(f"n must be a non-negative int, got {n!r}")


def _check_prompt_request(name: str, n: int, num_tokens: int | None, lo: int, hi: int) -> None:
    """The arguments of a task's prompts(): a count, and a prompt length in [lo, hi] tokens when one is asked."""
    _check_count(n)
    if num_tokens is not None and not lo <= num_tokens <= hi:
        raise InvalidValueError(f"num_tokens must be in [{lo}, {hi}] for {name} prompts, got {num_tokens}")


class SortDistinctTask:
    """tiny-t5's task: the distinct characters of a string of 4..40 digits and lowercase letters, in alphabet
    order (digits first), then EOS: "banana42" -> "24abn"."""

    name = "sort-distinct"
    model = "tiny-t5"
    default_max_tokens = 48            # the longest answer is 36 characters + EOS
    min_prompt_tokens = SORT_MIN_LEN
    max_prompt_tokens = SORT_MAX_LEN

    def max_tokens(self, prompt: str) -> int:
        """The answer plus EOS."""
        return len(set(prompt)) + 1

    @staticmethod
    def is_held_out(text: str) -> bool:
        return _held_out(f"reverse:{text}", 8)          # the key the shipped weights were trained with

    @staticmethod
    def random_string(rng: random.Random, length: int) -> str:
        return "".join(rng.choice(SORT_ALPHABET) for _ in range(length))

    def prompts(self, n: int, seed: int = 0, num_tokens: int | None = None) -> list[str]:
        _check_prompt_request(self.name, n, num_tokens, SORT_MIN_LEN, SORT_MAX_LEN)
        rng = random.Random(f"{self.name}:{seed}:{num_tokens}")
        out = []
        while len(out) < n:
            length = num_tokens if num_tokens is not None else rng.randint(SORT_MIN_LEN, SORT_MAX_LEN)
            text = self.random_string(rng, length)
            if self.is_held_out(text):
                out.append(text)
        return out

    def validate(self, prompt: str) -> str:
        """The prompt itself when it is in the domain; ValueError saying why otherwise."""
        if not isinstance(prompt, str):
            raise InvalidTypeError(f"a {self.name} prompt is a str, got {type(prompt).__name__}")
        bad = sorted({ch for ch in prompt if ch not in SORT_ALPHABET})
        if bad or not SORT_MIN_LEN <= len(prompt) <= SORT_MAX_LEN:
            why = f"characters {''.join(bad)!r} are not digits or lowercase letters" if bad else \
                f"it has {len(prompt)} characters"
            raise InvalidValueError(f"{prompt!r} is outside {self.model}'s domain: {SORT_MIN_LEN}..{SORT_MAX_LEN} digits "
                                    f"and lowercase letters ({why})")
        return prompt

    def expected(self, prompt: str, num_chars: int) -> str:
        self.validate(prompt)
        return "".join(sorted(set(prompt), key=SORT_ALPHABET.index))[:num_chars]

    def check(self, prompt: str, text: str) -> bool:
        """True when `text` is the whole answer (the model must also have stopped: no prefix credit)."""
        return text == self.expected(prompt, len(prompt))


class ContinuationTask:
    """Arithmetic continuation for a checkpoint directory with its own tokenizer."""

    name = "arithmetic-continuation"
    default_max_tokens = 12

    def __init__(self, tokenizer, model: str = "checkpoint", encoder_decoder: bool = False):
        self.tokenizer, self.model, self.encoder_decoder = tokenizer, model, encoder_decoder
        self._window = WindowArithmeticTask(model=model)

    def max_tokens(self, prompt: str) -> int:
        return self.default_max_tokens

    def num_tokens(self, prompt: str) -> int:
        """Prompt tokens as the engine feeds them: BOS + the prompt (the encoder's input for T5: no BOS)."""
        return len(self.tokenizer.encode(prompt)) + (0 if self.encoder_decoder else 1)

    def round_trips(self, prompt: str) -> bool:
        try:
            return self.tokenizer.decode(self.tokenizer.encode(prompt)) == prompt
        except (ValueError, KeyError):
            return False

    def prompts(self, n: int, seed: int = 0, num_tokens: int | None = None) -> list[str]:
        _check_count(n)
        rng = random.Random(f"{self.name}:{seed}:{num_tokens}")
        out = []
        for _ in range(20_000 * (n + 1)):
            if len(out) == n:
                return out
            prompt = self._window.sample(rng, held_out=None)
            if self.round_trips(prompt) and (num_tokens is None or self.num_tokens(prompt) == num_tokens):
                out.append(prompt)
        raise InvalidValueError(f"could not build {n} arithmetic prompts of {num_tokens} tokens that {self.model}'s "
                                f"tokenizer encodes and decodes unchanged")

    def validate(self, prompt: str) -> str:
        if not isinstance(prompt, str):
            raise InvalidTypeError(f"a prompt is a str, got {type(prompt).__name__}")
        return prompt

    def expected_numbers(self, prompt: str, count: int) -> list[int]:
        first, step, terms = self._window.validate(prompt)
        last = first + (terms - 1) * step
        return [last + step * (i + 1) for i in range(count)]

    def check(self, prompt: str, text: str) -> bool:
        """True when the integers `text` starts with continue the prompt's sequence (the last may be cut short,
        when `text` ends in its digits); at least one number is needed."""
        found = re.findall(r"\d+", text)
        if not found or re.match(r"\D*", text).group(0).strip(" ,;\n\t") != "":
            return False
        want = [str(v) for v in self.expected_numbers(prompt, len(found))]
        *whole, last = found
        cut = text.rstrip() == text and text.endswith(last)
        return whole == want[:-1] and (last == want[-1] or (cut and want[-1].startswith(last)))


Task = WindowArithmeticTask | SortDistinctTask | ContinuationTask
_TASKS = {"tiny-gemma4": WindowArithmeticTask, "tiny-t5": SortDistinctTask,
          "tiny-gemma4-e2b": lambda: WindowArithmeticTask(model="tiny-gemma4-e2b")}


def for_model(name: str) -> Task:
    """The task of shipped model `name` (tiny-gemma4-e2b, with random weights, takes tiny-gemma4's prompts)."""
    if name not in _TASKS:
        raise InvalidValueError(f"no task for model {name!r}; known models: {', '.join(_TASKS)}")
    return _TASKS[name]()


def for_checkpoint(tokenizer, model: str = "checkpoint", encoder_decoder: bool = False) -> Task:
    """The task for a checkpoint directory, adapted to what its tokenizer can encode."""
    task = ContinuationTask(tokenizer, model, encoder_decoder)
    if task.round_trips("3 7 11 15 250 263"):
        return task
    sort = SortDistinctTask()
    if task.round_trips(SORT_ALPHABET):
        return sort
    raise InvalidValueError(f"{model}'s tokenizer cannot write back '3 7 11 15' (digits and spaces) nor {SORT_ALPHABET!r}: "
                            f"no reproduction task fits it")
