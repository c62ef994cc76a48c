"""SamplingParams: how to sample one request, with vLLM's names and defaults, checked when built.

Defaults as vLLM's: temperature 1.0 (pass temperature=0 for greedy), top_p 1.0, top_k 0 (off; -1 also means off),
min_p 0.0, n 1, max_tokens 16. Every bad value raises InvalidValueError / InvalidTypeError (a ValueError /
TypeError) that says what to pass instead. It imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from minikv.kernels.errors import InvalidTypeError, InvalidValueError

# Temperatures below this make logits / temperature overflow float16 for ordinary logits; above MAX_TEMPERATURE
# sampling is uniform noise. Both bounds are far outside any useful setting.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 100.0
MAX_SEED = 2**63 - 1
MAX_N = 64                  # completions per request: each is a sequence of its own in the cache
MAX_LOGPROBS = 20           # vLLM's default cap on top logprobs per token


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request (vLLM's names and defaults); frozen and validated when built.

    `temperature`  1.0 by default; 0 is greedy (argmax), else between MIN_TEMPERATURE and MAX_TEMPERATURE.
    `top_p`        keep the smallest set of most likely tokens whose probability reaches top_p (0 < top_p <= 1).
    `top_k`        keep the k most likely tokens; 0 or -1: all of them.
    `min_p`        drop tokens less likely than min_p times the most likely one (0 <= min_p <= 1).
    `n`            completions to generate for the prompt (`RequestOutput.outputs` holds n of them).
    `seed`         makes sampling repeatable (0 <= seed <= 2**63 - 1); completion i of a request draws from
                   seed + i. None derives a seed from the engine's seed and the request id.
    `stop`         a string or a list of strings that end a completion when they appear in its text; the text is
                   cut before the stop string (after it with `include_stop_str_in_output=True`), even where the
                   string starts inside a token; token_ids keep every generated token.
    `stop_token_ids` token ids that end a completion, as the end-of-sequence token does (neither is part of
                   token_ids or text).
    `logprobs`     None, or k >= 0: each generated token's log probability and the k most likely tokens'
                   (`CompletionOutput.logprobs`), computed from the model's raw logits.
    `max_tokens`   new tokens to generate (at least 1; the engine refuses more than the model has room for).
    `ignore_eos`   keep generating past the end-of-sequence token (useful for fixed-length benchmarks).
    `detokenize`   False: token ids only, `text` stays "" (for ids the tokenizer cannot write; no stop strings).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | tuple[str, ...] | None = None
    stop_token_ids: list[int] | tuple[int, ...] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int = 16
    logprobs: int | None = None
    detokenize: bool = True

    def __post_init__(self):
        if not _is_int(self.n):
            raise InvalidTypeError(f"n must be an int (completions per prompt), got {type(self.n).__name__}")
        if not 1 <= self.n <= MAX_N:
            raise InvalidValueError(f"n must be between 1 and {MAX_N} (completions per prompt), got {self.n}")
        if not _is_number(self.temperature):
            raise InvalidTypeError(f"temperature must be a number, got {type(self.temperature).__name__}")
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):  # rejects NaN
            raise InvalidValueError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE} and "
                                    f"{MAX_TEMPERATURE}, got {self.temperature}")
        if not _is_number(self.top_p):
            raise InvalidTypeError(f"top_p must be a number, got {type(self.top_p).__name__}")
        if not 0 < self.top_p <= 1:
            raise InvalidValueError(f"top_p must be in (0, 1] (1 keeps every token), got {self.top_p}")
        if not _is_int(self.top_k):
            raise InvalidTypeError(f"top_k must be an int, got {type(self.top_k).__name__}")
        if self.top_k < -1:
            raise InvalidValueError(f"top_k must be 0 or -1 (every token) or at least 1, got {self.top_k}")
        if not _is_number(self.min_p):
            raise InvalidTypeError(f"min_p must be a number, got {type(self.min_p).__name__}")
        if not 0 <= self.min_p <= 1:
            raise InvalidValueError(f"min_p must be in [0, 1] (0 keeps every token), got {self.min_p}")
        if self.seed is not None:
            if not _is_int(self.seed):
                raise InvalidTypeError(f"seed must be an int or None, got {type(self.seed).__name__}")
            if not 0 <= self.seed <= MAX_SEED - MAX_N:
                raise InvalidValueError(f"seed must be between 0 and 2**63 - {MAX_N + 1}, got {self.seed}")
        object.__setattr__(self, "stop", _check_stop(self.stop))
        object.__setattr__(self, "stop_token_ids", _check_stop_token_ids(self.stop_token_ids))
        for name in ("include_stop_str_in_output", "ignore_eos", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidTypeError(f"{name} must be True or False, got {type(getattr(self, name)).__name__}")
        if self.stop and not self.detokenize:
            raise InvalidValueError("stop strings are looked for in the text: give detokenize=True, or "
                                    "stop_token_ids instead")
        if not _is_int(self.max_tokens):
            raise InvalidTypeError(f"max_tokens must be an int, got {type(self.max_tokens).__name__}")
        if self.max_tokens < 1:
            raise InvalidValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.logprobs is not None:
            if not _is_int(self.logprobs):
                raise InvalidTypeError(f"logprobs must be an int or None, got {type(self.logprobs).__name__}")
            if not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise InvalidValueError(f"logprobs must be between 0 (the sampled token's only) and {MAX_LOGPROBS}, "
                                        f"or None; got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _check_stop(stop) -> tuple[str, ...] | None:
    if stop is None:
        return None
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise InvalidTypeError(f"stop must be a str, a list of str or None, got {type(stop).__name__}")
    for text in stop:
        if not isinstance(text, str) or not text:
            raise InvalidValueError(f"stop strings must be non-empty strings, got {text!r}")
    return tuple(stop) or None


def _check_stop_token_ids(ids) -> tuple[int, ...] | None:
    if ids is None:
        return None
    if not isinstance(ids, (list, tuple)):
        raise InvalidTypeError(f"stop_token_ids must be a list of int or None, got {type(ids).__name__}")
    for t in ids:
        if not _is_int(t) or t < 0:
            raise InvalidValueError(f"stop_token_ids must be token ids (ints >= 0), got {t!r}")
    return tuple(ids) or None
