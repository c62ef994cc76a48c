"""Chooses how the Triton kernels run: compiled on a CUDA GPU, or in the Triton interpreter on a CPU.
See docs/internals.md#kernels-mode."""
from __future__ import annotations

import os
import sys

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    # imported earlier (by the user, or by a CUDA build of torch), triton defined its own @jit helpers compiled
    _TRITON_IMPORTED_FIRST = "triton.language" in sys.modules
else:
    _TRITON_IMPORTED_FIRST = False

INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# Triton 3.6's interpreter cannot use a computed loop bound (its tensors' __index__ fails on NumPy 2): 3.7 can.
MIN_INTERPRETER_TRITON = (3, 7)


class KernelModeError(RuntimeError):
    """A kernel was called with tensors on a device its mode cannot serve."""


def mode_name() -> str:
    return "interpreter (CPU)" if INTERPRETED else "compiled (CUDA)"


def interpreter_problem() -> str | None:
    """Why this process's Triton cannot interpret minikv's kernels, or None if it can."""
    import triton
    version = tuple(int(part) for part in triton.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_INTERPRETER_TRITON:
        return (f"minikv's kernels need triton>={'.'.join(map(str, MIN_INTERPRETER_TRITON))} to run in Triton's "
                f"interpreter on CPU; this process has triton {triton.__version__}. Install a newer one "
                f"(pip install 'triton>={'.'.join(map(str, MIN_INTERPRETER_TRITON))}') or use backend='torch'.")
    return None


def require_device(*tensors: torch.Tensor) -> torch.device:
    """Check that every tensor lives on the device this process's kernels can run on; return it."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if INTERPRETED and interpreter_problem():
        raise KernelModeError(interpreter_problem())
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


if INTERPRETED:
    from . import interpreter
    interpreter.adapt(redefine_language=_TRITON_IMPORTED_FIRST)
