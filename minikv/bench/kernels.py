"""`python -m minikv.bench kernels`: time each Triton kernel against its torch reference on this device.
See docs/internals.md#bench-kernels."""
from __future__ import annotations

import argparse
import dataclasses

import torch
from tqdm import tqdm

from minikv.bench.timing import time_ms
from minikv.cache.layout import KVLayout
from minikv.kernels.addressing import sequence_slots
from minikv.kernels import (INTERPRETED, context_attention, context_attention_reference, launch, mode,
                            paged_context_attention, paged_context_attention_reference, paged_decode_attention,
                            paged_decode_attention_reference, write_kv, write_kv_reference)


@dataclasses.dataclass
class Row:
    name: str
    kernel_ms: float
    baseline: str
    baseline_ms: float
    note: str = ""

    @property
    def speedup(self) -> float:
        return self.baseline_ms / self.kernel_ms


def _time_ms(fn, device: str) -> float:
    """Median milliseconds per call (minikv.bench.timing: CUDA events on a GPU, wall clock on CPU)."""
    return time_ms(fn, device, reps=20 if device == "cuda" else 3).ms


def _graph_ms(fn) -> float | None:
    """GPU time of `fn` replayed from a CUDA graph (no Python launch overhead); None if it cannot be captured."""
    timing = time_ms(fn, "cuda", reps=20, graph=True)
    return timing.ms if timing.how == "cuda graph" else None


def _rate(nbytes: int, ms: float) -> str:
    per_second = nbytes / ms * 1e3
    return f"{per_second / 1e9:.0f} GB/s" if per_second >= 1e9 else f"{per_second / 1e6:.1f} MB/s"


def _paged_problem(kv_cache_dtype, dtype, batch, context, num_heads, kv_heads, head_size, block_size, device,
                   q_len=1):
    """A pool holding `batch` sequences of `context` tokens in shuffled blocks, plus queries and contiguous K/V."""
    spec = KVLayout(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    gen = torch.Generator().manual_seed(0)
    tables = torch.randperm(num_blocks, generator=gen).reshape(batch, blocks_per_seq).to(torch.int32).to(device)
    pool = torch.zeros(num_blocks, spec.block_bytes, dtype=torch.uint8, device=device)
    k = torch.randn(batch * context, kv_heads, head_size, device=device).to(dtype)
    v = torch.randn(batch * context, kv_heads, head_size, device=device).to(dtype)
    slots = torch.cat([sequence_slots(row, context, block_size) for row in tables])
    write_kv(k, v, pool, slots, spec)
    q = torch.randn(batch * q_len, num_heads, head_size, device=device).to(dtype)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return spec, pool, tables, seq_lens, q, k, v


def _bench_write(device, kv_cache_dtype, dtype, tokens, kv_heads=8, head_size=128, block_size=16) -> Row:
    spec = KVLayout(kv_cache_dtype, dtype, kv_heads, head_size, block_size)
    num_blocks = -(-tokens // block_size) + 1
    pool = torch.zeros(num_blocks, spec.block_bytes, dtype=torch.uint8, device=device)
    key = torch.randn(tokens, kv_heads, head_size, device=device).to(dtype)
    value = torch.randn(tokens, kv_heads, head_size, device=device).to(dtype)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    t_kernel = _time_ms(lambda: write_kv(key, value, pool, slots, spec, validate=False), device)
    t_ref = _time_ms(lambda: write_kv_reference(key, value, pool, slots, spec, validate=False), device)
    return Row(f"write_kv {kv_cache_dtype}/{str(dtype)[6:]} T={tokens}", t_kernel, "reference", t_ref,
               f"{_rate(2 * tokens * spec.slot_bytes, t_kernel)} written")


def _sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            enable_gqa=k.shape[1] != q.shape[1])


def _bench_decode(device, kv_cache_dtype, dtype, batch, context, num_heads=32, kv_heads=8, head_size=128,
                  block_size=16, with_reference=False, config=None) -> Row:
    spec, pool, tables, seq_lens, q, k, v = _paged_problem(kv_cache_dtype, dtype, batch, context, num_heads,
                                                           kv_heads, head_size, block_size, device)
    sm_scale = head_size ** -0.5
    t_kernel = _time_ms(lambda: paged_decode_attention(q, pool, tables, seq_lens, spec, sm_scale, validate=False,
                                                       config=config), device)
    kv_bytes = 2 * batch * context * spec.slot_bytes
    note = f"{_rate(kv_bytes, t_kernel)} of KV"
    if device == "cuda":
        splits = (config or launch.decode_config(batch, kv_heads, num_heads // kv_heads, head_size, spec.elem_bytes,
                                                 tables.shape[1] * block_size, q.device, fmt=spec.fmt,
                                                 placement=spec.placement)).num_splits
        note += f", {splits} split(s)"
    if with_reference or device != "cuda":
        t_ref = _time_ms(lambda: paged_decode_attention_reference(q, pool, tables, seq_lens, spec, sm_scale,
                                                                  validate=False), device)
        return Row(f"decode {kv_cache_dtype}/{str(dtype)[6:]} B={batch} ctx={context}", t_kernel, "reference",
                   t_ref, note)
    qs = q.reshape(batch, num_heads, 1, head_size)
    ks = k.reshape(batch, context, kv_heads, head_size).transpose(1, 2).contiguous().to(q.dtype)
    vs = v.reshape(batch, context, kv_heads, head_size).transpose(1, 2).contiguous().to(q.dtype)
    t_sdpa = _time_ms(lambda: _sdpa(qs, ks, vs, False), device)
    if batch <= 8:        # small problems are bound by Python launch overhead: also show pure GPU time
        g_kernel = _graph_ms(lambda: paged_decode_attention(q, pool, tables, seq_lens, spec, sm_scale,
                                                            validate=False, config=config))
        g_sdpa = _graph_ms(lambda: _sdpa(qs, ks, vs, False))
        if g_kernel and g_sdpa:
            note += f"; CUDA graph: {g_kernel:.3f} ms vs SDPA {g_sdpa:.3f} ms ({g_sdpa / g_kernel:.2f}x)"
    return Row(f"decode {kv_cache_dtype}/{str(dtype)[6:]} B={batch} ctx={context}", t_kernel, "SDPA (contiguous)",
               t_sdpa, note)


def _prefill_flops(batch, length, num_heads, head_size, causal) -> float:
    return 4.0 * batch * length * length * num_heads * head_size * (0.5 if causal else 1.0)


def _bench_prefill(device, dtype, batch, length, num_heads, kv_heads, head_size, causal=True,
                   kv_cache_dtype=None, baseline="sdpa", config=None) -> Row:
    """Unfused context attention (kv_cache_dtype None) or the fused paged path reading a cache of that format."""
    cu = torch.tensor([i * length for i in range(batch + 1)], dtype=torch.int32, device=device)
    sm_scale = head_size ** -0.5
    if kv_cache_dtype is None:
        q = torch.randn(batch * length, num_heads, head_size, device=device).to(dtype)
        k = torch.randn(batch * length, kv_heads, head_size, device=device).to(dtype)
        v = torch.randn(batch * length, kv_heads, head_size, device=device).to(dtype)
        run = lambda: context_attention(q, k, v, cu, cu, causal, sm_scale, validate=False,  # noqa: E731
                                        config=config)
        ref = lambda: context_attention_reference(q, k, v, cu, cu, causal, sm_scale, validate=False)  # noqa: E731
        name = f"prefill {str(dtype)[6:]} B={batch} L={length} H={num_heads}/{kv_heads}"
    else:
        spec, pool, tables, seq_lens, q, k, v = _paged_problem(kv_cache_dtype, dtype, batch, length, num_heads,
                                                               kv_heads, head_size, 16, device, q_len=length)
        run = lambda: paged_context_attention(q, pool, tables, cu, seq_lens, spec, causal, sm_scale,  # noqa: E731
                                              validate=False, config=config)
        ref = lambda: paged_context_attention_reference(q, pool, tables, cu, seq_lens, spec, causal,  # noqa: E731
                                                        sm_scale, validate=False)
        name = f"fused prefill {kv_cache_dtype}/{str(dtype)[6:]} B={batch} L={length} H={num_heads}/{kv_heads}"
    t_kernel = _time_ms(run, device)
    flops = _prefill_flops(batch, length, num_heads, head_size, causal)
    note = f"{flops / t_kernel / 1e9:.0f} TFLOP/s" if device == "cuda" else f"{flops / t_kernel / 1e6:.2f} GFLOP/s"
    if baseline == "reference":
        return Row(name, t_kernel, "reference", _time_ms(ref, device), note)
    qs = q.reshape(batch, length, num_heads, head_size).transpose(1, 2).contiguous()
    ks = k.reshape(batch, length, kv_heads, head_size).transpose(1, 2).contiguous().to(dtype)
    vs = v.reshape(batch, length, kv_heads, head_size).transpose(1, 2).contiguous().to(dtype)
    t_sdpa = _time_ms(lambda: _sdpa(qs, ks, vs, causal), device)
    note += f" (SDPA {flops / t_sdpa / 1e9:.0f})"
    return Row(name, t_kernel, "SDPA (contiguous)", t_sdpa, note)


def _interpreter_launch_cost_ms() -> float:
    """Milliseconds the interpreter spends per launched program (a kernel that stores one value)."""
    import triton
    import triton.language as tl

    @triton.jit
    def _touch(ptr):
        tl.store(ptr + tl.program_id(0), 1.0)

    buf = torch.zeros(257)
    one = _time_ms(lambda: _touch[(1,)](buf), "cpu")
    many = _time_ms(lambda: _touch[(257,)](buf), "cpu")
    return (many - one) / 256


def _gpu_cases(quick: bool):
    bf16 = torch.bfloat16
    cases = [
        lambda: _bench_write("cuda", "auto", bf16, 16384),
        lambda: _bench_write("cuda", "int8_per_token_head", bf16, 16384),
        lambda: _bench_write("cuda", "fp8", bf16, 16384),
        lambda: _bench_decode("cuda", "auto", bf16, 64, 4096),
        lambda: _bench_decode("cuda", "auto", bf16, 4, 4096),
        lambda: _bench_decode("cuda", "int8_per_token_head", bf16, 64, 4096),
        lambda: _bench_decode("cuda", "fp8", bf16, 64, 4096),
        lambda: _bench_prefill("cuda", bf16, 8, 4096, 32, 32, 128),
        lambda: _bench_prefill("cuda", bf16, 8, 4096, 32, 8, 128),
    ]
    if not quick:
        cases += [
            lambda: _bench_decode("cuda", "auto", bf16, 1, 4096),
            lambda: _bench_decode("cuda", "fp8_per_token_head", bf16, 64, 4096),
            lambda: _bench_decode("cuda", "auto", bf16, 8, 1024, with_reference=True),
            lambda: _bench_prefill("cuda", bf16, 8, 4096, 32, 8, 128, kv_cache_dtype="auto"),
            lambda: _bench_prefill("cuda", bf16, 8, 4096, 32, 8, 128, kv_cache_dtype="fp8"),
            lambda: _bench_prefill("cuda", torch.float16, 2, 2048, 16, 16, 64),
            lambda: _bench_prefill("cuda", bf16, 2, 1024, 8, 8, 128, baseline="reference"),
        ]
    return cases


def _cpu_cases(quick: bool):
    f32, f16 = torch.float32, torch.float16
    cases = [
        lambda: _bench_write("cpu", "auto", f16, 64, kv_heads=2, head_size=64),
        lambda: _bench_write("cpu", "int8_per_token_head", f32, 64, kv_heads=2, head_size=64),
        lambda: _bench_decode("cpu", "auto", f16, 4, 256, num_heads=8, kv_heads=2, head_size=64),
        lambda: _bench_decode("cpu", "fp8_per_token_head", f32, 4, 256, num_heads=8, kv_heads=2, head_size=64),
        lambda: _bench_prefill("cpu", f32, 2, 128, 8, 2, 64, baseline="reference"),
    ]
    if not quick:
        cases += [
            lambda: _bench_prefill("cpu", f16, 2, 128, 8, 2, 64, kv_cache_dtype="int8_per_token_head",
                                   baseline="reference"),
        ]
    return cases


PREFILL_SWEEP = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3)]
DECODE_SWEEP = [(64, 4, 3), (128, 4, 5), (128, 8, 3), (32, 4, 4)]


def _sweep(label: str, configs: list, bench) -> list[Row]:
    """Run `bench(config)` for each launch configuration in turn (GPU tuning aid)."""
    rows = []
    for config in configs:
        try:
            row = bench(config)
            row.name = f"  {label} {config}"
            rows.append(row)
        except Exception as exc:  # noqa: BLE001 - report and go on: a config may not fit shared memory
            print(f"{label} {config} failed: {type(exc).__name__}: {str(exc)[:160]}")
    return rows


def _sweeps() -> list[Row]:
    bf16 = torch.bfloat16
    rows = []
    prefill = [launch.ContextConfig(*c) for c in PREFILL_SWEEP]
    rows += _sweep("prefill MHA", prefill, lambda c: _bench_prefill("cuda", bf16, 8, 4096, 32, 32, 128, config=c))
    rows += _sweep("fused prefill int8", prefill,
                   lambda c: _bench_prefill("cuda", bf16, 8, 4096, 32, 8, 128, kv_cache_dtype="int8_per_token_head",
                                            config=c))
    for fmt in ("auto", "fp8", "int8_per_token_head"):
        one_byte = fmt != "auto"
        decode = [launch.DecodeConfig(16, n, 1, w, st, f16_dot=one_byte, convert_asm=one_byte)
                  for n, w, st in DECODE_SWEEP]
        rows += _sweep(f"decode {fmt}", decode, lambda c, fmt=fmt: _bench_decode("cuda", fmt, bf16, 64, 4096,
                                                                                  config=c))
    return rows


def _print_table(rows: list[Row]) -> None:
    if not rows:
        print("no case ran")
        return
    width = max(len(r.name) for r in rows) + 2
    print(f"{'case':<{width}}{'kernel ms':>11}  {'baseline':<18}{'base ms':>10}{'base/kernel':>13}  note")
    for r in rows:
        print(f"{r.name:<{width}}{r.kernel_ms:>11.3f}  {r.baseline:<18}{r.baseline_ms:>10.3f}{r.speedup:>12.2f}x"
              f"  {r.note}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m minikv.bench kernels", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases")
    parser.add_argument("--sweep", action="store_true", help="GPU: try several tile configurations")
    args = parser.parse_args(argv)
    device = "cpu" if INTERPRETED else "cuda"
    print(f"minikv kernels, {mode.mode_name()}, torch {torch.__version__}"
          + (f", {torch.cuda.get_device_name()}" if device == "cuda" else ""))
    cases = _gpu_cases(args.quick) if device == "cuda" else _cpu_cases(args.quick)
    rows = []
    for case in tqdm(cases, desc="kernels", unit="case"):
        try:
            rows.append(case())
        except Exception as exc:  # noqa: BLE001 - one failing case should not hide the others' figures
            print(f"case failed: {type(exc).__name__}: {exc}")
    if args.sweep and device == "cuda":
        rows += _sweeps()
    _print_table(rows)
    if device == "cpu":
        print(f"interpreter cost per launched program: {_interpreter_launch_cost_ms():.2f} ms")
    return 0
