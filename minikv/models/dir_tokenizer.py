"""The tokenizer of a checkpoint directory.

Two kinds, tried in this order:

* `minikv_tokenizer.json`: minikv's own character tokenizer spec, `{"type": "char", "alphabet": "..."}`
  (ids 0, 1, 2 are PAD, BOS, EOS, then one id per character), for the tiny models trained here;
* `tokenizer.json`: a Hugging Face `tokenizers` file (real checkpoints); needs the `tokenizers` package. Special
  ids come from config.json (`pad_token_id`, `bos_token_id`, `eos_token_id`).

Both expose what the engine uses: `encode(text) -> ids` (no specials added), `decode(ids) -> text` (specials
skipped), `pad_id`, `bos_id`, `eos_id`, `vocab_size`.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from minikv.models.tokenizer import CharTokenizer

MINIKV_TOKENIZER_FILE, HF_TOKENIZER_FILE = "minikv_tokenizer.json", "tokenizer.json"


class TokenizerFileError(RuntimeError):
    """A checkpoint directory without a usable tokenizer file."""


class HFTokenizer:
    """A `tokenizers.Tokenizer` behind minikv's tokenizer interface."""

    def __init__(self, path: str | Path, pad_id: int | None, bos_id: int | None, eos_id: int | None):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerFileError(f"{path} needs the `tokenizers` package: pip install tokenizers") from None
        self._tok = Tokenizer.from_file(str(path))
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)


def _first(value):
    return value[0] if isinstance(value, list) else value


def load_tokenizer(path: str | Path):
    """The tokenizer stored in checkpoint directory `path` (see the module docstring for the file names)."""
    path = Path(path)
    spec_file = path / MINIKV_TOKENIZER_FILE
    if spec_file.is_file():
        spec = json.loads(spec_file.read_text())
        if spec.get("type") != "char" or not isinstance(spec.get("alphabet"), str):
            raise TokenizerFileError(f'{spec_file}: expected {{"type": "char", "alphabet": "..."}}, got {spec}')
        return CharTokenizer(spec["alphabet"])
    if (path / HF_TOKENIZER_FILE).is_file():
        config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        config = config.get("text_config") or config
        return HFTokenizer(path / HF_TOKENIZER_FILE, config.get("pad_token_id"), config.get("bos_token_id"),
                           _first(config.get("eos_token_id")))
    raise TokenizerFileError(f"{path} has no tokenizer: add {MINIKV_TOKENIZER_FILE} (minikv's character "
                             f"tokenizer) or {HF_TOKENIZER_FILE} (Hugging Face tokenizers)")


def save_char_tokenizer(tokenizer: CharTokenizer, path: str | Path) -> Path:
    file = Path(path) / MINIKV_TOKENIZER_FILE
    file.write_text(json.dumps({"type": "char", "alphabet": tokenizer.alphabet}, indent=2) + "\n")
    return file
