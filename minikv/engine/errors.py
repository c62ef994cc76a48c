"""The engine's errors: a state it cannot serve from (exit status 3). The base class, `MinikvError`, and its
exit statuses live in minikv.kernels.errors, the lowest layer."""
from __future__ import annotations

from minikv.kernels.errors import ENGINE_FAULT, MinikvError


class EngineFaultError(MinikvError):
    """The engine is in a state it cannot serve from (exit status 3)."""

    exit_status = ENGINE_FAULT


class ConcurrentUseError(EngineFaultError, RuntimeError):
    """An LLM was called from a second thread while a call from another thread was still running."""


class EngineNeedsResetError(EngineFaultError, RuntimeError):
    """The engine's KV arena was overrun earlier; call reset() (or sleep() then wake_up()) before using it."""
