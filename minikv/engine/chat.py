"""Chat templates: a checkpoint's own template, rendered with jinja2 the way transformers renders it.

Where the template comes from and what it sees: docs/internals.md#engine-chat.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from minikv.kernels.errors import BadInputError, InvalidTypeError

CONFIG_FILE, TEMPLATE_FILE = "tokenizer_config.json", "chat_template.jinja"
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token")


class ChatTemplateError(BadInputError, ValueError):
    """A model without a chat template, or a template that refused the conversation (raise_exception)."""


def load_chat_template(directory: str | Path | None) -> tuple[str | None, dict[str, str]]:
    """(the template or None, the special tokens' strings) of a checkpoint directory (None: a model without one)."""
    if directory is None:
        return None, {}
    directory = Path(directory)
    config = {}
    if (directory / CONFIG_FILE).is_file():
        try:
            config = json.loads((directory / CONFIG_FILE).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ChatTemplateError(f"{directory / CONFIG_FILE} is not readable JSON: {err}") from None
    template = config.get("chat_template")
    if template is None and (directory / TEMPLATE_FILE).is_file():
        template = (directory / TEMPLATE_FILE).read_text()
    if isinstance(template, list):     # several named templates: transformers uses the one named "default"
        template = {t.get("name"): t.get("template") for t in template}.get("default")
    specials = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            specials[name] = value
    return template, specials


@lru_cache(maxsize=8)
def _compile(template: str):
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatTemplateError("LLM.chat needs jinja2: pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       namespace=jinja2.utils.Namespace)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise ChatTemplateError(f"the chat template does not parse (line {err.lineno}): {err.message}") from None


def check_messages(messages) -> list[list[dict]]:
    """One conversation (a list of {"role", "content"} dicts) or a list of them, as a list of conversations."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidTypeError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts, or a list "
                               f"of such lists; got {messages!r:.60}")
    batch = [messages] if isinstance(messages[0], dict) else list(messages)
    for i, conv in enumerate(batch):
        if not isinstance(conv, (list, tuple)) or not conv:
            raise InvalidTypeError(f"conversation {i} must be a non-empty list of message dicts, got {conv!r:.60}")
        for j, m in enumerate(conv):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise InvalidTypeError(f"message {j} of conversation {i} must be a dict with a str 'role' and a "
                                       f"'content', got {m!r:.60}")
    return [list(c) for c in batch]


def render(template: str, conversation: list[dict], specials: dict[str, str], add_generation_prompt: bool = True,
           **kwargs) -> str:
    """The prompt text `template` makes of one conversation."""
    compiled = _compile(template)
    import jinja2
    if not isinstance(add_generation_prompt, bool):
        raise InvalidTypeError(f"add_generation_prompt must be True or False, got {add_generation_prompt!r}")
    try:
        return compiled.render(messages=conversation, add_generation_prompt=add_generation_prompt,
                                         **specials, **kwargs)
    except jinja2.exceptions.TemplateError as err:
        raise ChatTemplateError(f"the chat template refused this conversation: {err}") from None


def no_template_error(model: str) -> ChatTemplateError:
    return ChatTemplateError(f"model {model!r} has no chat template (no 'chat_template' in {CONFIG_FILE} and no "
                             f"{TEMPLATE_FILE} in its directory): pass chat_template=... to LLM.chat, or call "
                             f"LLM.generate with a plain prompt")
