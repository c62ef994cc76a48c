"""decode_matmul: a decode step's matmul with the step after it in one launch, for the few rows of a decode batch:
GELU(x @ gate.T) * (x @ up.T), GELU(x @ gate.T) * t, x @ w.T alone, or x @ w.T of three weights stacked (q, k
and v) into one output.
See docs/internals.md#kernels-decode-matmul."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import launch
from .errors import InvalidTypeError, InvalidValueError

GELU_UP, GELU_TIMES, ONE, STACK = 0, 1, 2, 3   # what the kernel does with its products


@triton.jit
def _gelu_times(gate, other, DTYPE: tl.constexpr):
    """torch's gelu(gate, approximate="tanh") * other on DTYPE tensors, each step rounded to DTYPE as torch does."""
    g = gate.to(DTYPE).to(tl.float32)
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
    return (0.5 * g * (1.0 + tanh)).to(DTYPE).to(tl.float32) * other.to(DTYPE).to(tl.float32)


@triton.jit
def _decode_matmul_kernel(x_ptr, w_ptr, w2_ptr, times_ptr, out_ptr, M, N, K, n2, n3,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr):
    launch.wait_for_inputs()
    first = tl.program_id(0) * BLOCK_N
    n = first + tl.arange(0, BLOCK_N)
    if MODE == 3:          # STACK: columns from n2 on are w2's rows, from n3 on times_ptr's: BLOCK_N divides each
        if first >= n3:
            w_ptr = times_ptr - n3 * K
        elif first >= n2:
            w_ptr = w2_ptr - n2 * K
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    w_at = n[None, :].to(tl.int64) * K + k[:, None]            # [BLOCK_K, BLOCK_N]: W.T's tile, read along K
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + m[:, None] * K + (k0 + k)[None, :], mask=(m < M)[:, None], other=0.0)
        acc = tl.dot(x, tl.load(w_ptr + k0 + w_at), acc)
        if MODE == 0:                                          # GELU_UP: a second weight
            acc2 = tl.dot(x, tl.load(w2_ptr + k0 + w_at), acc2)
    at, rows = m[:, None] * N + n[None, :], (m < M)[:, None]
    dtype = out_ptr.dtype.element_ty
    if MODE == 0:                                              # GELU_UP
        acc = _gelu_times(acc, acc2, dtype)
    if MODE == 1:                                              # GELU_TIMES
        acc = _gelu_times(acc, tl.load(times_ptr + at, mask=rows, other=0.0), dtype)
    tl.store(out_ptr + at, acc.to(dtype), mask=rows)


def decode_matmul_reference(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None,
                            times: torch.Tensor | None = None, stack: tuple[torch.Tensor, torch.Tensor] | None = None):
    """At most one of: `up` -> gelu_tanh(x @ gate.T) * (x @ up.T); `times` -> gelu_tanh(x @ gate.T) * times; `stack`
    (two weights) -> x @ cat(gate, *stack).T; none: x @ gate.T. Each product in float32, rounded to x's dtype."""
    product = lambda w: F.linear(x.float(), w.float()).to(x.dtype)
    if up is None and times is None:
        return product(gate if stack is None else torch.cat([gate, *stack]))
    return F.gelu(product(gate), approximate="tanh") * (product(up) if up is not None else times)


def _check(x, gate, up, times, stack) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise InvalidTypeError(f"x must be a 2-D float tensor [rows, K], got {getattr(x, 'dtype', type(x).__name__)} "
                               f"{list(getattr(x, 'shape', []))}")
    if sum(t is not None for t in (up, times, stack)) > 1:
        raise InvalidValueError("give at most one of up, times and stack")
    if stack is not None and (not isinstance(stack, tuple) or len(stack) != 2):
        raise InvalidValueError(f"stack must be a tuple of two weights, got {type(stack).__name__}")
    for name, w in (("gate", gate), ("up", up), *(("stack", s) for s in stack or ())):
        if w is not None and (not isinstance(w, torch.Tensor) or w.dtype != x.dtype or not w.is_contiguous()
                              or w.dim() != 2 or w.shape[1] != x.shape[1]
                              or name == "up" and w.shape != gate.shape):
            raise InvalidValueError(f"{name} must be contiguous {x.dtype} [N, {x.shape[1]}] (up: gate's shape), "
                                    f"got {getattr(w, 'dtype', '')} {list(getattr(w, 'shape', []))}")
    if times is not None and (not isinstance(times, torch.Tensor) or times.dtype != x.dtype
                              or tuple(times.shape) != (x.shape[0], gate.shape[0])):
        raise InvalidValueError(f"times must be {x.dtype} [{x.shape[0]}, {gate.shape[0]}], got "
                                f"{getattr(times, 'dtype', '')} {list(getattr(times, 'shape', []))}")


def decode_matmul(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None,
                  times: torch.Tensor | None = None, stack: tuple[torch.Tensor, torch.Tensor] | None = None,
                  validate: bool = True, config: launch.MatmulConfig | None = None):
    """decode_matmul_reference's result from one launch, or None where launch.matmul_config has no configuration
    for the shape (more rows than a decode batch, odd sizes: the caller then runs torch's steps)."""
    if validate:
        _check(x, gate, up, times, stack)
    sizes = [gate.shape[0], *(w.shape[0] for w in stack or ())]
    (m, k), n = x.shape, sum(sizes)
    cfg = config or launch.matmul_config(m, n, k, x.dtype, 2 if up is not None else 1)
    if cfg is None or any(size % cfg.block_n for size in sizes):
        return None
    mode = GELU_UP if up is not None else GELU_TIMES if times is not None else ONE if stack is None else STACK
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    second = up if up is not None else stack[0] if stack is not None else gate
    third = times.contiguous() if times is not None else stack[1] if stack is not None else x
    _decode_matmul_kernel[(n // cfg.block_n,)](
        x, gate, second, third, out, m, n, k, *((sizes[0], n - sizes[2]) if stack else (n, n)), BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, MODE=mode, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch.PDL_LAUNCH)
    return out
