"""Prompts in the forms vLLM takes them, turned into one shape the engine checks and tokenizes.

A prompt is a str, `{"prompt": str}` or `{"prompt_token_ids": [int, ...]}` (ids used as given: no BOS is added).
An encoder-decoder model (tiny-t5) also takes `{"encoder_prompt": P, "decoder_prompt": P or None}`, each P one of
those three forms; a plain prompt is its encoder prompt, and the decoder starts from the model's start token.
`generate` takes one prompt or a list of them. Anything else raises InvalidTypeError naming the accepted forms.
"""
from __future__ import annotations

from dataclasses import dataclass

from minikv.kernels.errors import InvalidTypeError, InvalidValueError

FORMS = ('a str, {"prompt": str} or {"prompt_token_ids": [int, ...]} (encoder-decoder models also take '
         '{"encoder_prompt": ..., "decoder_prompt": ...})')


@dataclass(frozen=True)
class Prompt:
    """One prompt part: its text, or its token ids (exactly one of them is set)."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class PromptInput:
    """A parsed prompt: `main` is the decoder-only prompt or the encoder prompt; `decoder` the decoder prompt of an
    explicit encoder/decoder pair (None: start from the model's start token)."""

    main: Prompt
    decoder: Prompt | None = None
    explicit_pair: bool = False


def _part(value, where: str) -> Prompt:
    if isinstance(value, str):
        return Prompt(text=value)
    if isinstance(value, dict):
        keys = set(value)
        if keys == {"prompt"} and isinstance(value["prompt"], str):
            return Prompt(text=value["prompt"])
        if keys == {"prompt_token_ids"}:
            ids = value["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)):
                raise InvalidTypeError(f"{where}['prompt_token_ids'] must be a list of int, got {type(ids).__name__}")
            if not ids:
                raise InvalidValueError(f"{where}['prompt_token_ids'] is empty: give at least one token id")
            for i, t in enumerate(ids):
                if isinstance(t, bool) or not isinstance(t, int):
                    raise InvalidTypeError(f"{where}['prompt_token_ids'][{i}] must be an int, got {type(t).__name__}")
            return Prompt(token_ids=tuple(ids))
        if keys == {"prompt"}:
            raise InvalidTypeError(f"{where}['prompt'] must be a str, got {type(value['prompt']).__name__}")
        raise InvalidTypeError(f"{where} has keys {sorted(keys)}; a prompt is {FORMS}")
    raise InvalidTypeError(f"{where} is a {type(value).__name__}; a prompt is {FORMS}")


def parse_prompt(value, where: str = "prompt") -> PromptInput:
    """One prompt in any accepted form (`where`: how an error names it)."""
    if isinstance(value, dict) and "encoder_prompt" in value:
        extra = set(value) - {"encoder_prompt", "decoder_prompt"}
        if extra:
            raise InvalidTypeError(f"{where} has unknown keys {sorted(extra)}; an encoder-decoder prompt is "
                                   f'{{"encoder_prompt": ..., "decoder_prompt": ...}}')
        dec = value.get("decoder_prompt")
        return PromptInput(_part(value["encoder_prompt"], f"{where}['encoder_prompt']"),
                           None if dec is None else _part(dec, f"{where}['decoder_prompt']"), explicit_pair=True)
    return PromptInput(_part(value, where))


def parse_prompts(prompts) -> list[PromptInput]:
    """One prompt, or a list/tuple of them, as a list."""
    if isinstance(prompts, (str, dict)):
        return [parse_prompt(prompts)]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidTypeError(f"prompts must be one prompt or a list of them, got {type(prompts).__name__}; "
                               f"a prompt is {FORMS}")
    return [parse_prompt(p, f"prompts[{i}]") for i, p in enumerate(prompts)]


class PromptEncoder:
    """Turns a parsed prompt into the engine's token ids for one model, checking it: text is tokenized (and checked
    against a shipped model's task, `task`), token ids must lie in the vocabulary, and the prompt must leave room to
    generate (`encode`)."""

    def __init__(self, tokenizer, model_config, task, model_name: str):
        self.tokenizer, self.model_config, self.task, self.model_name = tokenizer, model_config, task, model_name

    def tokens(self, part: Prompt, where: str, encoder: bool) -> list[int]:
        """The ids of one prompt part, checked: text is tokenized (and checked against a shipped model's task);
        token ids must lie in the model's vocabulary."""
        vocab = self.model_config.vocab_size
        if part.token_ids is not None:
            bad = [t for t in part.token_ids if not 0 <= t < vocab]
            if bad:
                raise InvalidValueError(f"{where}: token id {bad[0]} is outside the model's vocabulary [0, {vocab})")
            if self.task is not None and encoder:
                self.task.validate(self.tokenizer.decode(part.token_ids))
            return list(part.token_ids)
        text = part.text
        if not text:
            raise InvalidValueError(f"empty prompt ({where}): give at least one character")
        if text.isspace():
            raise InvalidValueError(f"{where} {text!r} is only whitespace: give the model something to continue")
        ids = self.tokenizer.encode(text)
        if self.task is not None and encoder:
            self.task.validate(text)
        return ids

    def encode(self, prompt: PromptInput, where: str = "prompt") -> tuple[list[int], list[int] | None]:
        """(decoder prompt ids, encoder ids or None) for one parsed prompt, with clear errors for bad input."""
        mc = self.model_config
        if mc.is_encoder_decoder:
            enc = self.tokens(prompt.main, where, encoder=True)
            if len(enc) > mc.max_encoder_len:
                raise InvalidValueError(f"{where} is {len(enc)} tokens, longer than the encoder's maximum "
                                        f"{mc.max_encoder_len}")
            # The decoder starts from the model's start token where the config names one (T5: its
            # decoder_start_token_id, 0 = pad in real checkpoints), else from BOS; a decoder prompt follows it.
            start = getattr(mc, "decoder_start_token_id", self.tokenizer.bos_id)
            dec = [] if prompt.decoder is None else self.decoder_tokens(prompt.decoder, f"{where}['decoder_prompt']")
            return ([start] + dec if dec[:1] != [start] else dec), enc
        if prompt.explicit_pair:
            raise InvalidTypeError(f"{where}: {self.model_name} is a decoder-only model; give a plain prompt, not "
                                   f"an encoder_prompt/decoder_prompt pair")
        ids = self.tokens(prompt.main, where, encoder=True)
        if prompt.main.token_ids is None:          # text: BOS in front, as the tokenizer of a Gemma model adds it
            ids = [self.tokenizer.bos_id] + ids
        return ids, None

    def decoder_tokens(self, part: Prompt, where: str) -> list[int]:
        if part.token_ids is not None:
            return self.tokens(part, where, encoder=False)
        # A decoder prompt is a forced prefix of the output: tokenized without the encoder's template (T5's </s>).
        plain = getattr(self.tokenizer, "add_special_tokens", None)
        try:
            if plain is not None:
                self.tokenizer.add_special_tokens = False
            return self.tokens(part, where, encoder=False)
        finally:
            if plain is not None:
                self.tokenizer.add_special_tokens = plain
