"""decode_matmul: a decode step's matmul with the step after it in one launch, for the few rows of a decode batch:
GELU(x @ gate.T) * (x @ up.T), GELU(x @ gate.T) * t, x @ k.T with x @ v.T, or x @ w.T alone.
See docs/internals.md#kernels-decode-matmul."""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from . import launch
from .errors import InvalidTypeError, InvalidValueError

GELU_UP, GELU_TIMES, PAIR, ONE = 0, 1, 2, 3   # what the kernel does with its products (ONE: x @ gate.T alone)


@triton.jit
def _gelu_times(gate, other, DTYPE: tl.constexpr):
    """torch's gelu(gate, approximate="tanh") * other on DTYPE tensors, each step rounded to DTYPE as torch does."""
    g = gate.to(DTYPE).to(tl.float32)
    inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
    tanh = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
    return (0.5 * g * (1.0 + tanh)).to(DTYPE).to(tl.float32) * other.to(DTYPE).to(tl.float32)


@triton.jit
def _decode_matmul_kernel(x_ptr, w_ptr, w2_ptr, times_ptr, out_ptr, out2_ptr, M, N, K, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr):
    launch.wait_for_inputs()
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    w_at = n[None, :].to(tl.int64) * K + k[:, None]            # [BLOCK_K, BLOCK_N]: W.T's tile, read along K
    for k0 in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + m[:, None] * K + (k0 + k)[None, :], mask=(m < M)[:, None], other=0.0)
        acc = tl.dot(x, tl.load(w_ptr + k0 + w_at), acc)
        if MODE == 0 or MODE == 2:                             # GELU_UP, PAIR: a second weight
            acc2 = tl.dot(x, tl.load(w2_ptr + k0 + w_at), acc2)
    at, rows = m[:, None] * N + n[None, :], (m < M)[:, None]
    dtype = out_ptr.dtype.element_ty
    if MODE == 0:                                              # GELU_UP
        acc = _gelu_times(acc, acc2, dtype)
    if MODE == 1:                                              # GELU_TIMES
        acc = _gelu_times(acc, tl.load(times_ptr + at, mask=rows, other=0.0), dtype)
    if MODE == 2:                                              # PAIR
        tl.store(out2_ptr + at, acc2.to(dtype), mask=rows)
    tl.store(out_ptr + at, acc.to(dtype), mask=rows)


def decode_matmul_reference(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None,
                            times: torch.Tensor | None = None, pair: torch.Tensor | None = None):
    """At most one of: `up` -> gelu_tanh(x @ gate.T) * (x @ up.T); `times` -> gelu_tanh(x @ gate.T) * times; `pair`
    -> (x @ gate.T, x @ pair.T); none: x @ gate.T. Each product in float32, rounded to x's dtype, as each step."""
    product = lambda w: F.linear(x.float(), w.float()).to(x.dtype)
    if up is None and times is None and pair is None:
        return product(gate)
    if pair is not None:
        return product(gate), product(pair)
    return F.gelu(product(gate), approximate="tanh") * (product(up) if up is not None else times)


def _check(x, gate, up, times, pair) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise InvalidTypeError(f"x must be a 2-D float tensor [rows, K], got {getattr(x, 'dtype', type(x).__name__)} "
                               f"{list(getattr(x, 'shape', []))}")
    if sum(t is not None for t in (up, times, pair)) > 1:
        raise InvalidValueError("give at most one of up, times and pair")
    for name, w in (("gate", gate), ("up", up), ("pair", pair)):
        if w is not None and (not isinstance(w, torch.Tensor) or w.dtype != x.dtype or not w.is_contiguous()
                              or tuple(w.shape) != (gate.shape[0] if name != "gate" else w.shape[0], x.shape[1])):
            raise InvalidValueError(f"{name} must be contiguous {x.dtype} [N, {x.shape[1]}] (up, pair: gate's shape), "
                                    f"got {getattr(w, 'dtype', '')} {list(getattr(w, 'shape', []))}")
    if times is not None and (not isinstance(times, torch.Tensor) or times.dtype != x.dtype
                              or tuple(times.shape) != (x.shape[0], gate.shape[0])):
        raise InvalidValueError(f"times must be {x.dtype} [{x.shape[0]}, {gate.shape[0]}], got "
                                f"{getattr(times, 'dtype', '')} {list(getattr(times, 'shape', []))}")


def decode_matmul(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor | None = None,
                  times: torch.Tensor | None = None, pair: torch.Tensor | None = None, validate: bool = True,
                  config: launch.MatmulConfig | None = None):
    """decode_matmul_reference's result from one launch, or None where launch.matmul_config has no configuration
    for the shape (more rows than a decode batch, odd sizes: the caller then runs torch's steps)."""
    if validate:
        _check(x, gate, up, times, pair)
    (m, k), n = x.shape, gate.shape[0]
    cfg = config or launch.matmul_config(m, n, k, x.dtype, 2 if up is not None or pair is not None else 1)
    if cfg is None:
        return None
    mode = GELU_UP if up is not None else GELU_TIMES if times is not None else PAIR if pair is not None else ONE
    x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    out2 = torch.empty_like(out) if mode == PAIR else out
    second = up if up is not None else pair if pair is not None else gate
    _decode_matmul_kernel[(n // cfg.block_n,)](
        x, gate, second, times.contiguous() if times is not None else x, out, out2, m, n, k, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, MODE=mode, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **launch.PDL_LAUNCH)
    return (out, out2) if mode == PAIR else out
