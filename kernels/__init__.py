"""minikv.kernels: the Triton kernels of minikv, each with a pure-PyTorch reference using the same byte addressing.

Installed under the import name `minikv.kernels` (the folder is the top-level `kernels/`). It imports nothing from
minikv. See `mode` for how the interpreter/compiled choice is made (it must happen before any kernel is defined).
"""
from . import mode  # noqa: F401  (must come first: sets TRITON_INTERPRET before any @triton.jit)
from .mode import INTERPRETED, KernelModeError, require_device  # noqa: F401
from . import formats  # noqa: F401
from .cache_write import write_kv, write_kv_reference  # noqa: E402,F401
from .decode_attention import paged_decode_attention, paged_decode_attention_reference  # noqa: E402,F401
from .context_attention import (context_attention, context_attention_reference,  # noqa: E402,F401
                                paged_context_attention, paged_context_attention_reference)
