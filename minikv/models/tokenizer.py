"""The character-level tokenizer of the tiny models: one token per character, plus PAD, BOS and EOS.

Ids 0, 1, 2 are the specials, then one id per character of the model's alphabet: tiny-gemma4's is space and the
ten digits, tiny-t5's the ten digits and the 26 lowercase letters (`minikv.models.registry`). The default
alphabet (space, digits, lowercase letters) serves random test checkpoints that take both kinds of prompt.
"""
from __future__ import annotations

from collections.abc import Iterable

from minikv.kernels.errors import InvalidTypeError, InvalidValueError

SPECIALS = ("<pad>", "<bos>", "<eos>")
ALPHABET = " 0123456789abcdefghijklmnopqrstuvwxyz"


class CharTokenizer:
    """Maps each character of `alphabet` to one id; ids 0, 1, 2 are PAD, BOS and EOS."""

    def __init__(self, alphabet: str = ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            raise InvalidValueError("alphabet has repeated characters")
        self.alphabet = alphabet
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self._first = len(SPECIALS)
        self._id_of = {ch: self._first + i for i, ch in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return self._first + len(self.alphabet)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, without specials."""
        if not isinstance(text, str):
            raise InvalidTypeError(f"encode takes a str, got {type(text).__name__}")
        try:
            return [self._id_of[ch] for ch in text]
        except KeyError as err:
            raise InvalidValueError(
                f"character {err.args[0]!r} is not in the tokenizer's alphabet {self.alphabet!r}"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special tokens are skipped."""
        chars = []
        for token in ids:
            token = int(token)
            if not 0 <= token < self.vocab_size:
                raise InvalidValueError(f"token id {token} is outside the vocabulary [0, {self.vocab_size})")
            if token >= self._first:
                chars.append(self.alphabet[token - self._first])
        return "".join(chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size}, alphabet={self.alphabet!r})"
