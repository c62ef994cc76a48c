"""The tokenizer of a checkpoint directory. See docs/internals.md#models-dir-tokenizer."""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from minikv.kernels.errors import InvalidTypeError, InvalidValueError
from minikv.models.tokenizer import CharTokenizer

MINIKV_TOKENIZER_FILE, HF_TOKENIZER_FILE = "minikv_tokenizer.json", "tokenizer.json"


class TokenizerFileError(RuntimeError):
    """A checkpoint directory without a usable tokenizer file."""


class HFTokenizer:
    """A `tokenizers.Tokenizer` behind minikv's tokenizer interface."""

    def __init__(self, path: str | Path, pad_id: int | None, bos_id: int | None, eos_id: int | None,
                 model_vocab: int | None = None, add_special_tokens: bool = False):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerFileError(f"{path} needs the `tokenizers` package: pip install tokenizers") from None
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as err:         # tokenizers raises its own Exception subclass for unreadable files
            raise TokenizerFileError(f"{path} is not a Hugging Face tokenizers file: {err}") from None
        self.path, self.model_vocab = Path(path), model_vocab
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        # Apply the file's post-processor (its template's special tokens) in encode, as transformers' standard
        # tokenizer(text) does; load_tokenizer switches it on for T5's encoder inputs.
        self.add_special_tokens = add_special_tokens

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def base_vocab_size(self) -> int:
        """The model vocabulary's part of the tokenizer (added tokens left out)."""
        return self._tok.get_vocab_size(with_added_tokens=False)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise InvalidTypeError(f"encode takes a str, got {type(text).__name__}")
        ids = self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids
        if self.model_vocab is not None and ids and max(ids) >= self.model_vocab:
            raise InvalidValueError(f"{self.path} encodes {text!r} with token id {max(ids)}, past the model's vocabulary "
                                    f"of {self.model_vocab} (config.json vocab_size)")
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _first(value):
    return value[0] if isinstance(value, list) else value


def _model_config(path: Path) -> dict:
    """The model's config (a multimodal Gemma-4's `text_config`), {} when the directory has no config.json."""
    from minikv.models.hf_checkpoint import CONFIG_FILE, CheckpointError, read_json
    if not (path / CONFIG_FILE).is_file():
        return {}
    try:
        config = read_json(path / CONFIG_FILE, "the model's config")
    except CheckpointError as err:
        raise TokenizerFileError(str(err)) from None
    text = config.get("text_config")
    return {**text, "model_type": "gemma4_text"} if isinstance(text, dict) else config


def _check_fits(tokenizer, size: int, file: Path, config: dict) -> None:
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and size > vocab:
        raise TokenizerFileError(f"{file}: the tokenizer has {size} token ids but the model's vocabulary "
                                 f"(config.json vocab_size) has only {vocab}; ids {vocab}..{size - 1} would index "
                                 f"past the embedding. Use the tokenizer the model was trained with")


def _check_char_spec(spec: dict, file: Path) -> CharTokenizer:
    if spec.get("type") != "char" or not isinstance(spec.get("alphabet"), str) or not spec["alphabet"]:
        raise TokenizerFileError(f'{file}: expected {{"type": "char", "alphabet": "..."}} with a non-empty '
                                 f'alphabet, got {json.dumps(spec)[:200]}')
    try:
        return CharTokenizer(spec["alphabet"])
    except ValueError as err:
        raise TokenizerFileError(f"{file}: {err}") from None


def load_tokenizer(path: str | Path, add_special_tokens: bool | None = None):
    """The tokenizer stored in checkpoint directory `path` (see the module docstring for the file names)."""
    from minikv.models.hf_checkpoint import CheckpointError, read_json
    path = Path(path)
    spec_file = path / MINIKV_TOKENIZER_FILE
    config = _model_config(path)
    if spec_file.exists():
        try:
            spec = read_json(spec_file, "minikv's character tokenizer")
        except CheckpointError as err:
            raise TokenizerFileError(str(err)) from None
        tokenizer = _check_char_spec(spec, spec_file)
        _check_fits(tokenizer, tokenizer.vocab_size, spec_file, config)
        return tokenizer
    hf_file = path / HF_TOKENIZER_FILE
    if hf_file.exists():
        ids = {k: _first(config.get(f"{k}_token_id")) for k in ("pad", "bos", "eos")}
        for key, value in ids.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise TokenizerFileError(f"{path / 'config.json'}: {key}_token_id must be a token id (an integer "
                                         f">= 0), got {value!r}")
        if config.get("model_type") != "t5" and (ids["bos"] is None or ids["eos"] is None):
            raise TokenizerFileError(f"{path / 'config.json'} names no bos_token_id / eos_token_id: a decoder-only "
                                     f"model's prompts start with BOS, and generation stops at EOS")
        vocab = config.get("vocab_size") if isinstance(config.get("vocab_size"), int) else None
        if add_special_tokens is None:
            add_special_tokens = config.get("model_type") == "t5"
        tokenizer = HFTokenizer(hf_file, ids["pad"], ids["bos"], ids["eos"], model_vocab=vocab,
                                add_special_tokens=add_special_tokens)
        _check_fits(tokenizer, tokenizer.base_vocab_size, hf_file, config)
        return tokenizer
    raise TokenizerFileError(f"{path} has no tokenizer: add {MINIKV_TOKENIZER_FILE} (minikv's character "
                             f"tokenizer) or {HF_TOKENIZER_FILE} (Hugging Face tokenizers)")


def save_char_tokenizer(tokenizer: CharTokenizer, path: str | Path) -> Path:
    file = Path(path) / MINIKV_TOKENIZER_FILE
    file.write_text(json.dumps({"type": "char", "alphabet": tokenizer.alphabet}, indent=2) + "\n")
    return file
