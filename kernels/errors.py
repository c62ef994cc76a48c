"""The one base class of every error minikv raises on purpose, and the exit status the `minikv` command gives it.
See docs/internals.md#kernels-errors."""
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
