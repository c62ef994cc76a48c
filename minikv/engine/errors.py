"""The engine's errors: a state it cannot serve from (exit status 3). The base class, `MinikvError`, and its
exit statuses live in minikv.kernels.errors, the lowest layer."""
from __future__ import annotations

from minikv.config import ReproConfig
from minikv.kernels.errors import ENGINE_FAULT, InvalidTypeError, MinikvError


class EngineFaultError(MinikvError):
    """The engine is in a state it cannot serve from (exit status 3)."""

    exit_status = ENGINE_FAULT


class ConcurrentUseError(EngineFaultError, RuntimeError):
    """An LLM was called from a second thread while a call from another thread was still running."""


class EngineNeedsResetError(EngineFaultError, RuntimeError):
    """The engine's KV arena was overrun earlier; call reset() (or sleep() then wake_up()) before using it."""


def moved_keywords_error(moved: dict) -> InvalidTypeError:
    """The TypeError for keywords LLM no longer takes: the reproduction switches now live in ReproConfig."""
    repro_fields = set(ReproConfig.__dataclass_fields__)
    unknown = sorted(set(moved) - repro_fields)
    if unknown:
        return InvalidTypeError(f"LLM() got an unexpected keyword argument {unknown[0]!r}")
    spelled = ", ".join(f"{k}={v!r}" for k, v in moved.items())
    return InvalidTypeError(f"LLM({', '.join(moved)}=...) is now a reproduction switch: pass "
                            f"repro=minikv.ReproConfig({spelled})")
