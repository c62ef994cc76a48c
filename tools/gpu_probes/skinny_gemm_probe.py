"""Can a Triton matmul for decode's few rows read the weights faster than cuBLAS? (CUDA machine)

    python tools/gpu_probes/skinny_gemm_probe.py OUT_DIR          # the probe below
    python tools/gpu_probes/skinny_gemm_probe.py OUT_DIR modes    # kernels/decode_matmul.py's modes over tiles

For each weight shape of a gemma-4-E2B decode step (and the merged k|v, gate|up and q|k|v shapes), x [M, K] @ W.T
with W [N, K] in bfloat16, M = 64 and 16: torch's F.linear (cuBLAS) against a small Triton kernel over a grid of
tiles, K splits and pipeline stages. Each timing is one CUDA graph of launches cycling through copies of W that
together exceed the L2 cache (a decode step reads every weight from DRAM once), so figures are per launch, cold L2.
Prints and writes skinny_gemm.csv (shape, M, which, config, us, GB/s, max_abs_diff against cuBLAS).
"""
import csv
import itertools
import os
import statistics
import sys

import torch
import triton
import triton.language as tl


# The kernel this probe measured (kernels/decode_matmul.py grew out of it, without the K splits): one program per
# BLOCK_N columns and split of K, every row; GELU_UP: gelu_tanh(x @ w.T) * (x @ up.T), each rounded as torch does.
@triton.jit
def _decode_matmul_kernel(x_ptr, w_ptr, up_ptr, out_ptr, M, N, K, K_PER_SPLIT, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GELU_UP: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    m = tl.arange(0, BLOCK_M)
    k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    w_at = n[None, :].to(tl.int64) * K + k[:, None]
    for k0 in range(split * K_PER_SPLIT, (split + 1) * K_PER_SPLIT, BLOCK_K):
        x = tl.load(x_ptr + m[:, None] * K + (k0 + k)[None, :], mask=(m < M)[:, None], other=0.0)
        acc = tl.dot(x, tl.load(w_ptr + k0 + w_at), acc)
        if GELU_UP:
            acc_up = tl.dot(x, tl.load(up_ptr + k0 + w_at), acc_up)
    if GELU_UP:
        dtype = out_ptr.dtype.element_ty
        g = acc.to(dtype).to(tl.float32)
        tanh = 1.0 - 2.0 / (tl.exp(2.0 * 0.7978845608028654 * (g + 0.044715 * g * g * g)) + 1.0)
        acc = (0.5 * g * (1.0 + tanh)).to(dtype).to(tl.float32) * acc_up.to(dtype).to(tl.float32)
    at = split * M * N + m[:, None] * N + n[None, :]
    tl.store(out_ptr + at, acc.to(out_ptr.dtype.element_ty), mask=(m < M)[:, None])


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, MN, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in range(SPLITS):
        acc += tl.load(part_ptr + s * MN + i, mask=i < MN, other=0.0)
    tl.store(out_ptr + i, acc.to(out_ptr.dtype.element_ty), mask=i < MN)


SHAPES = {"gate or up": (1536, 6144), "gate|up": (1536, 12288), "down": (6144, 1536), "q sliding": (1536, 2048),
          "q full": (1536, 4096), "o sliding": (2048, 1536), "o full": (4096, 1536), "k or v sliding": (1536, 256),
          "k|v sliding": (1536, 512), "k|v full": (1536, 1024), "q|k|v sliding": (1536, 2560),
          "ple gate": (1536, 256), "ple proj": (256, 1536)}
ROWS = (64, 16)
GRID = [dict(block_n=bn, block_k=bk, split=s, stages=st, warps=w)
        for bn, bk, s, st, w in itertools.product((16, 32, 64), (128, 256), (1, 2, 4), (3, 5), (4,))]


def skinny_linear(x, w, block_n, block_k, split, stages, warps, up=None):
    m, k = x.shape
    n = w.shape[0]
    block_m = max(16, triton.next_power_of_2(m))
    if split == 1:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        _decode_matmul_kernel[(n // block_n, 1)](x, w, w if up is None else up, out, m, n, k, k, BLOCK_M=block_m,
                                                 BLOCK_N=block_n, BLOCK_K=block_k, GELU_UP=up is not None,
                                                 num_stages=stages, num_warps=warps)
        return out
    part = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    _decode_matmul_kernel[(n // block_n, split)](x, w, w, part, m, n, k, k // split, BLOCK_M=block_m, BLOCK_N=block_n,
                                                 BLOCK_K=block_k, GELU_UP=False, num_stages=stages, num_warps=warps)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _sum_splits_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, SPLITS=split, BLOCK=1024)
    return out


def per_launch_us(fn, copies, reps=5):
    for i in range(len(copies)):
        fn(*copies[i])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in copies:
            fn(*c)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(1e3 * start.elapsed_time(end) / len(copies))
    return statistics.median(times)


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    rows = []
    for (name, (k, n)), m in itertools.product(SHAPES.items(), ROWS):
        nbytes = n * k * 2
        count = max(24, -(-400_000_000 // nbytes))
        copies = [(torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16() * 0.05)
                  for _ in range(count)]
        want = torch.nn.functional.linear(*copies[0]).float()
        base = per_launch_us(torch.nn.functional.linear, copies)
        best = None
        rows.append(dict(shape=name, K=k, N=n, M=m, which="cublas", config="", us=base, GBps=nbytes / base / 1e3,
                         max_abs_diff=0.0))
        for cfg in GRID:
            if n % cfg["block_n"] or k % (cfg["block_k"] * cfg["split"]):
                continue
            fn = lambda x, w, c=cfg: skinny_linear(x, w, c["block_n"], c["block_k"], c["split"], c["stages"], c["warps"])
            try:
                diff = (fn(*copies[0]).float() - want).abs().max().item()
                us = per_launch_us(fn, copies)
            except Exception as e:                    # out of shared memory or registers: say so, go on
                print(f"  {name} M={m} {cfg}: {type(e).__name__}", flush=True)
                continue
            row = dict(shape=name, K=k, N=n, M=m, which="triton", config=" ".join(f"{a}={b}" for a, b in cfg.items()),
                       us=us, GBps=nbytes / us / 1e3, max_abs_diff=diff)
            rows.append(row)
            best = row if best is None or us < best["us"] else best
        print(f"{name:15s} K={k:5d} N={n:5d} M={m:3d}: cuBLAS {base:6.2f} us ({nbytes / base / 1e3:5.0f} GB/s); best "
              f"triton {best['us']:6.2f} us ({best['GBps']:5.0f} GB/s, {base / best['us']:.2f}x, {best['config']}, "
              f"diff {best['max_abs_diff']:.3g})", flush=True)
        del copies
        torch.cuda.empty_cache()
    gelu = lambda t: torch.nn.functional.gelu(t, approximate="tanh")
    for m in ROWS:                      # the MLP's gelu(x @ gate.T) * (x @ up.T): torch's four launches, or one
        k, n = SHAPES["gate or up"]
        nbytes = 2 * n * k * 2
        copies = [(torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16() * 0.05,
                   torch.randn(n, k, device="cuda").bfloat16() * 0.05) for _ in range(max(24, -(-400_000_000 // nbytes)))]
        torch_mlp = lambda x, g, u: gelu(torch.nn.functional.linear(x, g)) * torch.nn.functional.linear(x, u)
        want = torch_mlp(*copies[0]).float()
        base = per_launch_us(torch_mlp, copies)
        rows.append(dict(shape="gelu(gate)*up", K=k, N=n, M=m, which="torch", config="", us=base,
                         GBps=nbytes / base / 1e3, max_abs_diff=0.0))
        best = None
        for cfg in (c for c in GRID if c["split"] == 1):
            fn = lambda x, g, u, c=cfg: skinny_linear(x, g, c["block_n"], c["block_k"], 1, c["stages"], c["warps"], up=u)
            try:
                diff = (fn(*copies[0]).float() - want).abs().max().item()
                us = per_launch_us(fn, copies)
            except Exception as e:
                print(f"  gelu(gate)*up M={m} {cfg}: {type(e).__name__}", flush=True)
                continue
            row = dict(shape="gelu(gate)*up", K=k, N=n, M=m, which="triton",
                       config=" ".join(f"{a}={b}" for a, b in cfg.items()), us=us, GBps=nbytes / us / 1e3,
                       max_abs_diff=diff)
            rows.append(row)
            best = row if best is None or us < best["us"] else best
        print(f"gelu(gate)*up   K={k:5d} N={n:5d} M={m:3d}: torch (4 launches) {base:6.2f} us; best triton {best['us']:6.2f} "
              f"us ({best['GBps']:5.0f} GB/s, {base / best['us']:.2f}x, {best['config']}, diff {best['max_abs_diff']:.3g})",
              flush=True)
        del copies
    with open(os.path.join(out_dir, "skinny_gemm.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def modes(out_dir):
    """kernels/decode_matmul.py itself, each mode at its E2B shapes and 64 rows, over tiles and stages."""
    from minikv.kernels.decode_matmul import decode_matmul
    from minikv.kernels.launch import MatmulConfig, matmul_config
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    for mode, (k, n) in (("up", (1536, 6144)), ("times", (1536, 256)), ("pair", (1536, 256)), ("pair", (1536, 512))):
        m = 64
        nbytes = (1 if mode == "times" else 2) * n * k * 2
        copies = []
        for _ in range(max(24, -(-400_000_000 // nbytes))):
            second = torch.randn(m, n, device="cuda").bfloat16() if mode == "times" else \
                torch.randn(n, k, device="cuda").bfloat16() * 0.05
            copies.append((torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16() * 0.05,
                           second))
        chosen = matmul_config(m, n, k, torch.bfloat16, 1 if mode == "times" else 2)
        results = []
        small = os.environ.get("MODES_GRID") == "small"         # a short device call: 12 configurations, not 36
        for bn, bk, st in itertools.product((16, 32) if small else (16, 32, 64), (128, 256) if small else (64, 128, 256),
                                            (3, 4, 5) if small else (2, 3, 4, 5)):
            if n % bn:
                continue
            cfg = MatmulConfig(64, bn, bk, num_stages=st)
            fn = lambda x, g, s, c=cfg, md=mode: decode_matmul(x, g, **{md: s}, validate=False, config=c)
            try:
                us = per_launch_us(fn, copies)
            except Exception as e:                    # out of shared memory: say so, go on
                print(f"  {mode} {cfg}: {type(e).__name__}", flush=True)
                continue
            results.append((us, cfg))
            rows.append(dict(mode=mode, K=k, N=n, M=m, block_n=bn, block_k=bk, stages=st, us=us,
                             GBps=nbytes / us / 1e3, chosen=cfg == chosen))
        results.sort(key=lambda r: r[0])
        mine = next((us for us, c in results if c == chosen), float("nan"))
        print(f"{mode:5s} K={k} N={n}: launch.py's {chosen} {mine:.2f} us; best {results[0][1]} {results[0][0]:.2f} us; "
              f"next {[(round(us, 2), c.block_n, c.block_k, c.num_stages) for us, c in results[1:4]]}", flush=True)
        del copies
    with open(os.path.join(out_dir, "modes.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    modes(sys.argv[1]) if sys.argv[2:] == ["modes"] else main(sys.argv[1])
