"""One kernel-level scenario for an attention backend, and the oracles that check it against float64 arithmetic.

A `KernelCase` is plain data (hypothesis draws and shrinks it; `code()` prints it). `check(backend, case)` builds
its pool (a slice of a larger allocation, permuted blocks, random unwritten bytes), writes the K/V through the
backend in two calls, runs the step for each reader, and returns the violations of INVARIANTS (tolerance.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from minikv.kernels import addressing, formats

from .tolerance import attention_bound, code_step

INVARIANTS = {
    "runs": "the backend accepts the inputs and returns finite outputs of the right shape",
    "write-stores": "each written row holds what minikv's reference writer stores, within one quantization step; "
                    "no other byte of the allocation changes",
    "reads-leave-pool": "an attention call changes no byte of the allocation",
    "matches-float64": "every output lies within the derived tolerance of attention computed in float64 on the "
                       "K/V the pool holds",
}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class KernelCase:
    family: str
    step: str = "decode"               # "decode", "context" (K/V from the pool) or "workspace" (from the workspace)
    kv_cache_dtype: str = "auto"
    scale_placement: str = "row"
    dtype: str = "float32"
    num_kv_heads: int = 1
    group: int = 1                     # query heads per KV head (GQA)
    head_size: int = 64
    block_size: int = 16
    seq_lens: tuple = (1,)             # KV tokens per request
    q_lens: tuple = ()                 # context steps: query tokens per request (default: all of them)
    causal: bool = True                # False: cross attention over an encoder's pool
    sliding_window: int = 0
    k_scale: float = 1.0               # "fp8": the per-layer scales
    v_scale: float = 1.0
    magnitude: float = 1.0             # K/V values are this times standard normal
    spare_blocks: int = 0              # pool blocks no request uses
    shuffle: int = 0                   # 0: blocks handed out in order; else the seed of their permutation
    pool_offset: int = 0               # blocks of another pool before this one in the same allocation
    readers: int = 1                   # layers reading the pool (KV sharing: one writes, all read)
    seed: int = 0

    def code(self) -> str:
        """The case as Python (the fields that differ from the defaults)."""
        changed = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                   if f.name == "family" or getattr(self, f.name) != f.default]
        return "KernelCase(" + ", ".join(changed) + ")"

    def query_lens(self) -> tuple:
        if self.step == "decode":
            return (1,) * len(self.seq_lens)
        return self.q_lens or self.seq_lens


@dataclass
class Violation:
    invariant: str
    summary: str
    expected: str = ""
    seen: str = ""


class Inputs:
    """The tensors of a case: an allocation holding the pool, block tables, K/V, queries."""

    def __init__(self, case: KernelCase, device):
        from minikv.cache.layout import KVLayout
        c, dev = case, torch.device(device)
        self.dtype = DTYPES[c.dtype]
        model_dtype = self.dtype if c.kv_cache_dtype == "auto" else torch.float16
        self.spec = KVLayout(c.kv_cache_dtype, model_dtype, c.num_kv_heads, c.head_size, c.block_size,
                             c.scale_placement if c.kv_cache_dtype in formats.PER_TOKEN_HEAD_KV_CACHE_DTYPES
                             else "row").spec
        bs, bb = c.block_size, self.spec.block_bytes
        need = [-(-n // bs) for n in c.seq_lens]
        total = sum(need) + c.spare_blocks
        order = torch.arange(total)
        if c.shuffle:
            order = torch.randperm(total, generator=torch.Generator().manual_seed(c.shuffle))
        rows, at = [], 0
        for n in need:
            rows.append(order[at:at + n].tolist() + [0] * (max(need) - n))
            at += n
        self.tables = torch.tensor(rows, dtype=torch.int32, device=dev)
        self.seq_lens = torch.tensor(c.seq_lens, dtype=torch.int32, device=dev)
        gen = torch.Generator().manual_seed(c.seed)
        # the allocation: another pool's blocks, this pool, one more block; every byte random at first
        self.arena = torch.randint(0, 256, ((c.pool_offset + total + 1) * bb,), generator=gen,
                                   dtype=torch.uint8).to(dev)
        self.start = c.pool_offset * bb
        self.pool = self.arena[self.start:self.start + total * bb]
        tokens = sum(c.seq_lens)
        shape = (tokens, c.num_kv_heads, c.head_size)
        self.key = (torch.randn(shape, generator=gen) * c.magnitude).to(dev, self.dtype)
        self.value = (torch.randn(shape, generator=gen) * c.magnitude).to(dev, self.dtype)
        self.slots = torch.cat([addressing.sequence_slots(self.tables[b].cpu(), n, bs)
                                for b, n in enumerate(c.seq_lens)]).to(dev)
        last = torch.tensor([sum(c.seq_lens[:b + 1]) - 1 for b in range(len(c.seq_lens))], device=dev)
        self.last = torch.zeros(tokens, dtype=torch.bool, device=dev)
        self.last[last] = True
        q_lens = case.query_lens()
        self.cu_q = torch.tensor([0] + [sum(q_lens[:b + 1]) for b in range(len(q_lens))], dtype=torch.int32,
                                 device=dev)
        self.cu_k = torch.tensor([0] + [sum(c.seq_lens[:b + 1]) for b in range(len(c.seq_lens))],
                                 dtype=torch.int32, device=dev)
        heads = c.num_kv_heads * c.group
        self.queries = [torch.randn(sum(q_lens), heads, c.head_size, generator=gen).to(dev, self.dtype)
                        for _ in range(c.readers)]
        # KV sharing: the readers after the first see the pool through their own window (none, or half the first's)
        self.windows = [c.sliding_window] + [(0, c.sliding_window // 2 or c.sliding_window)[r % 2]
                                             for r in range(1, c.readers)]
        self.sm_scale = c.head_size ** -0.5


def _slot_bytes(inp: Inputs, slots: torch.Tensor) -> torch.Tensor:
    """bool [arena bytes]: the bytes (codes and scales, K and V) of the cache slots `slots`."""
    spec, mask = inp.spec, torch.zeros(inp.arena.numel(), dtype=torch.bool, device=inp.arena.device)
    for kv in (0, 1):
        mask[inp.start + addressing.code_byte_offsets(spec, slots, kv).reshape(-1)] = True
        if formats.has_inline_scales(spec.fmt):
            sc = addressing.scale_byte_offsets(spec, slots, kv)[..., None] + torch.arange(4, device=slots.device)
            mask[inp.start + sc.reshape(-1)] = True
    return mask


def _where(inp: Inputs, byte: int) -> str:
    at = byte - inp.start
    if at < 0 or at >= inp.pool.numel():
        return f"allocation byte {byte}, outside the pool ({'before' if at < 0 else 'after'} it)"
    block, rest = divmod(at, inp.spec.block_bytes)
    return f"pool block {block}, {'V' if rest >= inp.spec.kv_bytes else 'K'} half, byte {rest % inp.spec.kv_bytes}"


def _values64(pool: torch.Tensor, spec, slots: torch.Tensor, kv: int, layer: float) -> torch.Tensor:
    """float64 [N, H, D]: the rows of `slots`, dequantized in float64 with the true scales."""
    codes, scales = addressing.gather_rows(pool, spec, slots, kv)
    x = codes.to(torch.float64)
    if scales is not None:
        x = x * scales.to(torch.float64)[..., None]
    return x * (layer if spec.fmt == formats.FP8 else 1.0)


def _check_write(case: KernelCase, inp: Inputs, initial: torch.Tensor) -> list[Violation]:
    from minikv import kernels
    ref = initial.clone()
    ref_pool = ref[inp.start:inp.start + inp.pool.numel()]
    for part in (~inp.last, inp.last):
        kernels.write_kv_reference(inp.key[part], inp.value[part], ref_pool, inp.slots[part], inp.spec,
                                   case.k_scale, case.v_scale, validate=False)
    outside = ~_slot_bytes(inp, inp.slots)
    changed = (inp.arena != ref) & outside
    if bool(changed.any()):
        first = int(changed.nonzero()[0])
        return [Violation("write-stores", f"the cache write changed {int(changed.sum())} byte(s) outside the rows "
                                          f"it was given, the first at {_where(inp, first)}",
                          "no byte outside the written rows changes", f"{int(changed.sum())} bytes changed")]
    for kv, layer in ((0, case.k_scale), (1, case.v_scale)):
        got = _values64(inp.pool, inp.spec, inp.slots, kv, layer)
        want = _values64(ref_pool, inp.spec, inp.slots, kv, layer)
        step = code_step(want, inp.spec.fmt, ref_pool, inp.spec, inp.slots, kv, layer)
        bad = ~((got - want).abs() <= step) if step is not None else got != want
        if bool(bad.any()):
            t, h, d = (int(i) for i in bad.nonzero()[0])
            slot = int(inp.slots[t])
            return [Violation("write-stores", f"{'KV'[kv]} of slot {slot} (block {slot // case.block_size}, place "
                                              f"{slot % case.block_size}), head {h}, element {d} is not what the "
                                              f"reference writer stores",
                              f"{float(want[t, h, d]):.6g}" + (f" (within {float(step[t, h, d]):.3g})"
                                                               if step is not None else " exactly"),
                              f"{float(got[t, h, d]):.6g}")]
    return []


def _reference(case: KernelCase, inp: Inputs, q: torch.Tensor, window: int):
    """(float64 output [Tq, Hq, D], tolerance [Tq, Hq, D]) of one reader's step."""
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    tol = torch.zeros_like(out)
    q_lens = case.query_lens()
    for b, kv_len in enumerate(case.seq_lens):
        rows = slice(int(inp.cu_q[b]), int(inp.cu_q[b + 1]))
        if case.step == "workspace":
            part = slice(int(inp.cu_k[b]), int(inp.cu_k[b + 1]))
            k, v = inp.key[part].to(torch.float64), inp.value[part].to(torch.float64)
        else:
            slots = addressing.sequence_slots(inp.tables[b], kv_len, case.block_size)
            k = _values64(inp.pool, inp.spec, slots, 0, case.k_scale)
            v = _values64(inp.pool, inp.spec, slots, 1, case.v_scale)
        visible = torch.ones(q_lens[b], kv_len, dtype=torch.bool, device=q.device)
        if case.causal:
            i = torch.arange(q_lens[b], device=q.device)[:, None] + kv_len - q_lens[b]
            j = torch.arange(kv_len, device=q.device)[None, :]
            visible = j <= i
            if window:
                visible = visible & (j > i - window)
        out[rows], tol[rows] = attention_bound(q[rows], k, v, visible, inp.sm_scale, inp.dtype)
    return out, tol


def _call(backend, case: KernelCase, inp: Inputs, q: torch.Tensor, window: int) -> torch.Tensor:
    if case.step == "decode":
        return backend.decode(q, inp.pool, inp.tables, inp.seq_lens, inp.spec, inp.sm_scale, case.k_scale,
                              case.v_scale, validate=False, sliding_window=window)
    if case.step == "context":
        return backend.paged_context(q, inp.pool, inp.tables, inp.cu_q, inp.seq_lens, inp.spec, case.causal,
                                     inp.sm_scale, case.k_scale, case.v_scale, validate=False, sliding_window=window)
    return backend.context(q, inp.key, inp.value, inp.cu_q, inp.cu_k, case.causal, inp.sm_scale, validate=False,
                           sliding_window=window)


def check(backend, case: KernelCase, device="cpu") -> list[Violation]:
    """The violations of `case` run on `backend` (an AttentionBackend); [] when every invariant holds."""
    inp = Inputs(case, device)
    initial = inp.arena.clone()
    stage = "the cache write"
    try:
        if case.step != "workspace":
            for part in (~inp.last, inp.last):
                backend.write_kv(inp.key[part], inp.value[part], inp.pool, inp.slots[part], inp.spec, case.k_scale,
                                 case.v_scale, validate=False)
            found = _check_write(case, inp, initial)
            if found:
                return found
        outputs = []
        for r, (q, window) in enumerate(zip(inp.queries, inp.windows)):
            stage = f"reader {r}'s {case.step} step"
            before = inp.arena.clone()
            out = _call(backend, case, inp, q, window)
            if not torch.equal(before, inp.arena):
                first = int((before != inp.arena).nonzero()[0])
                return [Violation("reads-leave-pool", f"reader {r}'s {case.step} step wrote into the allocation, "
                                                      f"first at {_where(inp, first)}")]
            outputs.append(out)
    except Exception as e:          # noqa: BLE001 -- any exception is the finding
        return [Violation("runs", f"{stage} raised {type(e).__name__}: {str(e).splitlines()[0][:200]}")]
    for r, (q, window, out) in enumerate(zip(inp.queries, inp.windows, outputs)):
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(q.shape):
            return [Violation("runs", f"reader {r}'s output has shape {tuple(getattr(out, 'shape', ()))}, expected "
                                      f"{tuple(q.shape)}")]
        if not bool(torch.isfinite(out).all()):
            return [Violation("runs", f"reader {r}'s output holds NaN or inf")]
        want, tol = _reference(case, inp, q, window)
        err = (out.to(torch.float64) - want).abs()
        bad = err > tol
        if bool(bad.any()):
            t, h, d = (int(i) for i in torch.unravel_index((err - tol).flatten().argmax(), err.shape))
            b = int(torch.searchsorted(inp.cu_q, torch.tensor(t, dtype=torch.int32, device=inp.cu_q.device),
                                       right=True)) - 1
            return [Violation("matches-float64", f"reader {r} ({case.step}, window {window}): request {b}, query "
                                                 f"row {t - int(inp.cu_q[b])}, head {h}, element {d} is off by "
                                                 f"{float(err[t, h, d]):.3g}, tolerance {float(tol[t, h, d]):.3g}",
                              f"{float(want[t, h, d]):.6g}", f"{float(out[t, h, d]):.6g}")]
    return []


def replay_case(backend, case: KernelCase, device: str | None = None) -> int:
    """Run `case` on `backend`, print each violated invariant with what was expected and seen; 1 if any, else 0."""
    found = check(backend, case, device or getattr(getattr(backend, "features", None), "device", "cpu"))
    for v in found:
        print(f"invariant {v.invariant}: {INVARIANTS[v.invariant]}")
        print(f"  {v.summary}")
        if v.expected or v.seen:
            print(f"  expected: {v.expected}")
            print(f"  seen:     {v.seen}")
    if not found:
        print("every invariant holds")
    return 1 if found else 0
