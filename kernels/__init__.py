"""minikv.kernels: the Triton kernels of minikv, each with a pure-PyTorch reference using the same byte addressing.

Installed under the import name `minikv.kernels` (the folder is the top-level `kernels/`). It imports nothing from
minikv. See `mode` for how the interpreter/compiled choice is made (it must happen before any kernel is defined).
"""
from . import mode  # noqa: F401  (must come first: sets TRITON_INTERPRET before any @triton.jit)
from .mode import INTERPRETED, KernelModeError, require_device  # noqa: F401
from . import formats  # noqa: F401
