"""The one base class of every error minikv raises on purpose, and the exit status the `minikv` command gives it.

    try:
        llm = minikv.LLM(model="path/to/checkpoint")
    except minikv.MinikvError as err:     # a bad checkpoint, a bad option, a found defect, an engine fault
        print(err, err.hint, err.exit_status)

Each error class derives from `MinikvError` *and* keeps its own standard base (`ModelLoadError` is still a
RuntimeError, a model config error still a ValueError), so code that catches the standard type keeps working.
`exit_status` says what kind of error it is, and is what `minikv` exits with: 2 bad input (a checkpoint or option
it cannot take), 1 a found defect or failed check (the sanitizer caught an overrun, a layout contract failed), 3 an
engine fault (the engine is in a state it cannot serve from). `hint`, when set, says what to do about it.

This module is in the lowest layer (minikv.kernels) so that every layer above can derive from it; it imports
nothing. Each layer's own errors live in that layer (the engine's in minikv.engine.errors).
"""
from __future__ import annotations

FOUND_DEFECT, BAD_INPUT, ENGINE_FAULT = 1, 2, 3


class MinikvError(Exception):
    """An error minikv raises on purpose. `exit_status`: 2 bad input, 1 found defect or failed check, 3 engine
    fault (the default); `hint`: what to do about it, or None."""

    exit_status: int = ENGINE_FAULT
    hint: str | None = None

    def __init__(self, *args, hint: str | None = None):
        super().__init__(*args)
        if hint is not None:
            self.hint = hint


class BadInputError(MinikvError):
    """Input minikv cannot take: a checkpoint, a configuration or an option (exit status 2)."""

    exit_status = BAD_INPUT


class CheckFailedError(MinikvError):
    """One of minikv's own checks caught a defect at work: a guard zone written, a layout contract broken
    (exit status 1)."""

    exit_status = FOUND_DEFECT


class InvalidValueError(BadInputError, ValueError):
    """An option, argument or prompt with a value minikv cannot take (still a ValueError)."""


class InvalidTypeError(BadInputError, TypeError):
    """An option, argument or prompt of a type minikv cannot take (still a TypeError)."""
