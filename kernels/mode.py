"""Chooses how the Triton kernels run: compiled on a CUDA GPU, or in the Triton interpreter on a CPU.

Triton reads TRITON_INTERPRET when each `@triton.jit` decorator runs, i.e. when a kernel module is imported.
This module is imported first by the package, so the switch is set before any kernel is defined:

* TRITON_INTERPRET already set by the user: respected.
* otherwise, no CUDA device: TRITON_INTERPRET=1 (every kernel runs in the interpreter, on CPU tensors).
* otherwise: compiled kernels, CUDA tensors.

A process can hold one mode only. `require_device` turns a tensor on the wrong device into a clear error instead
of Triton's own (for example "0 active drivers").
"""
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
        raise KernelModeError(
            f"minikv.kernels was imported in Triton interpreter mode (TRITON_INTERPRET=1), which runs on CPU "
            f"tensors only, but got a tensor on {device}. Start a new Python process (restart the notebook "
            f"kernel) without TRITON_INTERPRET set to compile the kernels for CUDA."
        )
    if not INTERPRETED and device.type != "cuda":
        raise KernelModeError(
            f"minikv.kernels was imported in compiled mode (a CUDA GPU was found), which runs on CUDA tensors "
            f"only, but got a tensor on {device}. To run on the CPU, set TRITON_INTERPRET=1 before the first "
            f"import of minikv (e.g. `TRITON_INTERPRET=1 python ...`, or os.environ in the first notebook cell), "
            f"or use backend='torch'."
        )
    return device
