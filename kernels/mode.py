"""Chooses how the Triton kernels run: compiled on a CUDA GPU, or in the Triton interpreter on a CPU.
See docs/internals.md#kernels-mode."""
from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class KernelModeError(RuntimeError):
    """A kernel was called with tensors on a device its mode cannot serve."""


def mode_name() -> str:
    return "interpreter (CPU)" if INTERPRETED else "compiled (CUDA)"


def require_device(*tensors: torch.Tensor) -> torch.device:
    """Check that every tensor lives on the device this process's kernels can run on; return it."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if INTERPRETED and device.type != "cpu":
        raise KernelModeError(f"minikv.kernels was imported in Triton interpreter mode (TRITON_INTERPRET=1), which "
                              f"runs on CPU tensors only, but got a tensor on {device}. Start a new Python process "
                              f"(restart the notebook kernel) without TRITON_INTERPRET set to compile the kernels for "
                              f"CUDA.")
    if not INTERPRETED and device.type != "cuda":
        raise KernelModeError(f"minikv.kernels was imported in compiled mode (a CUDA GPU was found), which runs on "
                              f"CUDA tensors only, but got a tensor on {device}. To run on the CPU, set "
                              f"TRITON_INTERPRET=1 before the first import of minikv (e.g. `TRITON_INTERPRET=1 python "
                              f"...`, or os.environ in the first notebook cell), or use backend='torch'.")
    return device


def _skip_repeated_language_patching() -> None:
    """Make calls between @triton.jit functions cheap in the interpreter."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    if not (hasattr(interp, "_patch_lang") and hasattr(interp, "GridExecutor")) or \
            getattr(interp, "_minikv_patched", False):
        return
    import triton.language as tl
    original_patch, original_launch = interp._patch_lang, interp.GridExecutor.__call__
    launch_state: list[set] = []            # per active launch: the language modules patched so far

    class _Nothing:
        def restore(self):
            pass

    def patch_lang(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)
        if launch_state and langs and langs <= launch_state[-1]:
            return _Nothing()
        scope = original_patch(fn)
        if launch_state:
            launch_state[-1].update(langs)
        return scope

    def launch(self, *args, **kwargs):
        launch_state.append(set())
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            launch_state.pop()

    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launch
    interp._minikv_patched = True


def _skip_overflow_checks_that_assert_nothing() -> None:
    """Drop the interpreter's integer-overflow checks, which can never fail."""
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return
    builder = getattr(interp, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or not hasattr(options, "sanitize_overflow") or options.debug:
        return
    import dataclasses
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


if INTERPRETED:
    _skip_repeated_language_patching()
    _skip_overflow_checks_that_assert_nothing()
