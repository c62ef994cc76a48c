"""Compile minikv's decode and context kernels for an NVIDIA H100/H200 (sm_90) on a machine without a GPU, and
report what the compiler made of it: registers, spills, shared memory, whether the pipeliner staged the loads through
shared memory (async copies in the TTGIR) and how many copies each iteration waits on, and the SASS instructions that
decide a memory-bound kernel's speed. Decode cases by shape and format; context cases start with "ctx-".

    python tools/gpu_compile.py [--dump DIR] [--case NAME ...] [--set FIELD=VALUE ...]
    python tools/gpu_compile.py --tests         (every decode case of tests/test_kernels_gpu.py fits an SM)

Needs only Triton's own ptxas and cuobjdump (shipped in its wheel); the Triton version should be the GPU
machine's (3.6 on the lent H200: put a 3.6 wheel first on PYTHONPATH). No kernel runs: each launch is compiled
and dropped.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"          # compiled mode, though this machine has no GPU
os.environ.setdefault("MINIKV_PDL", "1")      # as on an sm_90 GPU: the kernels wait on griddepcontrol

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402


class _OfflineDriver:
    """Just enough of a CUDA driver for Triton to compile (not launch) for sm_90."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


driver.set_active(_OfflineDriver())

from minikv.cache.layout import KVLayout  # noqa: E402
from minikv.kernels import decode_attention as dec  # noqa: E402
# by import_module: the package exports a function named context_attention
context_kernels = importlib.import_module("minikv.kernels.context_attention")
from minikv.kernels import launch  # noqa: E402

COMPILED: list = []
H200_SMS = 132          # an H200's SM count: sizes the split-K


class _CompileOnly:
    """Stands in for a @triton.jit kernel: `kernel[grid](...)` compiles for sm_90 and keeps the result."""

    def __init__(self, jit):
        self.jit = jit

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            COMPILED.append((self.jit.fn.__name__, self.jit.run(*args, grid=grid, warmup=True, **kwargs)))
        return run


def _compile_only():
    """Every decode and context kernel launch compiles (for sm_90) and records instead of running."""
    dec._decode_kernel = _CompileOnly(dec._decode_kernel)
    dec._merge_splits_kernel = _CompileOnly(dec._merge_splits_kernel)
    context_kernels._context_kernel = _CompileOnly(context_kernels._context_kernel)


SASS_OPS = ("LDGSTS", "LDG", "LDS", "LDSM", "STS", "I2F", "F2F", "PRMT", "HMMA", "HADD2", "HFMA2", "BAR", "LDL",
            "STL", "MUFU", "ATOM", "RED")


def loop_mix(sass: str, top: int = 12) -> str:
    """The longest loop of the SASS (the code between a backward branch and its target): its instruction count and
    most frequent opcodes, the work each tile of a kernel's main loop costs."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    loops = [(int(m.group(1), 16), a) for a, t in ins for m in [re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", t)]
             if m and int(m.group(1), 16) < a]
    if not loops:
        return "no loop"
    first, last = max(loops, key=lambda span: span[1] - span[0])
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                              for a, t in ins if first <= a <= last)
    return f"loop {sum(ops.values())} instructions: " + ", ".join(f"{k} {v}" for k, v in ops.most_common(top))


def report(name: str, kernel, dump: Path | None) -> str:
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        sass = subprocess.run([str(tools / "cuobjdump"), "--dump-sass", str(cubin)], capture_output=True,
                              text=True).stdout
        res = subprocess.run([str(tools / "cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                             text=True).stdout
    if dump:
        dump.mkdir(parents=True, exist_ok=True)
        for ext, text in (("ttgir", ttgir), ("ptx", ptx), ("sass", sass)):
            (dump / f"{name}.{ext}").write_text(text)
    regs = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    ops = {op: len(re.findall(rf"\b{op}(?:\.[A-Z0-9_.]+)?\s", sass)) for op in SASS_OPS}
    buffers = sorted(set(re.findall(r"memdesc<(\d+)x\d+x\d+xi8", ttgir)))
    waits = re.findall(r"async_wait .*?\{num = (\d+)", ttgir)
    return (f"{name:44s} regs {regs.group(1) if regs else '?':>3s} stack {stack.group(1) if stack else '?':>3s} "
            f"smem {kernel.metadata.shared:6d}  async_copy {ttgir.count('async_copy_global_to_local'):2d} "
            f"local_load {ttgir.count('ttg.local_load'):2d} code buffers {','.join(buffers) or '-'} "
            f"waits {','.join(waits) or '-'} | "
            + " ".join(f"{op} {n}" for op, n in ops.items() if n) + "\n    " + loop_mix(sass))


def decode_case(fmt: str, placement: str, dtype=torch.bfloat16, heads=(32, 8), head_size=128, batch=64,
                ctx=4096, **overrides):
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    heads = tuple(heads) if not isinstance(heads, str) else tuple(int(h) for h in heads.split("/"))
    """Compile the decode launch of one format at one shape (config from launch.decode_config, with overrides)."""
    num_heads, kv_heads = heads
    layout = KVLayout(fmt, dtype, kv_heads, head_size, 16, placement)
    pool = torch.zeros(64, layout.block_bytes, dtype=torch.uint8)
    tables = torch.zeros(batch, ctx // 16, dtype=torch.int32)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    q = torch.zeros(batch, num_heads, head_size, dtype=dtype)
    config_fields = {f.name for f in dataclasses.fields(launch.DecodeConfig)}
    shape = {k: overrides.pop(k) for k in list(overrides) if k not in config_fields}
    assert not shape, f"unknown fields {shape}"
    cfg = dataclasses.replace(
        launch.decode_config(batch, kv_heads, num_heads // kv_heads, head_size, layout.elem_bytes, ctx,
                             torch.device("cuda"), fmt=layout.fmt, placement=layout.placement, sms=H200_SMS),
        **overrides)
    COMPILED.clear()
    dec.paged_decode_attention(q, pool, tables, lens, layout, head_size ** -0.5, validate=False, config=cfg)
    return list(COMPILED)


def context_case(fmt: str, paged: bool = True, heads=(32, 8), head_size=128, batch=8, length=4096, window=0,
                 **overrides):
    """Compile the causal context launch (one prefill step: `batch` prompts of `length` tokens) of one format, paged
    or from the workspace (config from launch.context_config, with overrides)."""
    num_heads, kv_heads = heads
    q = torch.zeros(batch * length, num_heads, head_size, dtype=torch.bfloat16)
    cu = torch.arange(0, batch + 1, dtype=torch.int32) * length
    cfg = dataclasses.replace(launch.context_config(head_size, q.dtype, rows_per_seq=length * num_heads // kv_heads,
                                                    one_byte_cache=paged and fmt != "auto"), **overrides)
    COMPILED.clear()
    if paged:
        layout = KVLayout(fmt, q.dtype, kv_heads, head_size, 16)
        pool = torch.zeros(64, layout.block_bytes, dtype=torch.uint8)
        tables = torch.zeros(batch, length // 16, dtype=torch.int32)
        lens = torch.full((batch,), length, dtype=torch.int32)
        context_kernels.paged_context_attention(q, pool, tables, cu, lens, layout, True, 1.0, validate=False,
                                                sliding_window=window, config=cfg)
    else:
        k = torch.zeros(batch * length, kv_heads, head_size, dtype=q.dtype)
        context_kernels.context_attention(q, k, k, cu, cu, True, 1.0, validate=False, sliding_window=window, config=cfg)
    return list(COMPILED)


CONTEXT_CASES = {
    "ctx-paged": dict(fmt="auto"),
    "ctx-workspace": dict(fmt="auto", paged=False),
    "ctx-fp8pth": dict(fmt="fp8_per_token_head"),
    "ctx-256": dict(fmt="auto", heads=(8, 1), head_size=256, length=2048, window=512),
    "ctx-fp8pth-256": dict(fmt="fp8_per_token_head", heads=(8, 1), head_size=256, length=2048, window=512),
    "ctx-512": dict(fmt="auto", heads=(8, 1), head_size=512, length=2048),
}

CASES = {
    "auto": dict(fmt="auto", placement="row"),
    "fp8": dict(fmt="fp8", placement="row"),
    "int8-row": dict(fmt="int8_per_token_head", placement="row"),
    "int8-block": dict(fmt="int8_per_token_head", placement="block"),
    "fp8pth-row": dict(fmt="fp8_per_token_head", placement="row"),
    "fp8pth-block": dict(fmt="fp8_per_token_head", placement="block"),
    "int8-block-cast": dict(fmt="int8_per_token_head", placement="block", convert_asm=False),
    "int8-block-split": dict(fmt="int8_per_token_head", placement="block", batch=4),
    "auto-512": dict(fmt="auto", placement="row", heads=(8, 1), head_size=512, batch=5),
    "int8-512": dict(fmt="int8_per_token_head", placement="row", heads=(8, 1), head_size=512, batch=5),
    "auto-256": dict(fmt="auto", placement="row", heads=(8, 1), head_size=256, batch=5),
    "fp8pth-512": dict(fmt="fp8_per_token_head", placement="row", heads=(8, 1), head_size=512, ctx=8192),
    "fp8pth-512-block": dict(fmt="fp8_per_token_head", placement="block", heads=(8, 1), head_size=512, ctx=8192),
    "fp8pth-256": dict(fmt="fp8_per_token_head", placement="row", heads=(8, 1), head_size=256, ctx=8192),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dump", type=Path, default=None, help="write each kernel's TTGIR, PTX and SASS here")
    p.add_argument("--case", nargs="*", default=list(CASES), choices=list(CASES) + list(CONTEXT_CASES))
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="override DecodeConfig fields, e.g. num_stages=4 max_registers=128")
    args = p.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, value = item.split("=")
        overrides[key] = {"True": True, "False": False}.get(value, int(value) if value.isdigit() else value)
    _compile_only()
    print(f"triton {triton.__version__}, target sm_90")
    for case in args.case:
        tag = "".join(f",{k}={v}" for k, v in overrides.items())
        start = time.perf_counter()
        kernels = (context_case(**{**CONTEXT_CASES[case], **overrides}) if case in CONTEXT_CASES
                   else decode_case(**{**CASES[case], **overrides}))
        print(f"{case}{tag}: compiled in {time.perf_counter() - start:.1f} s")
        for kname, kernel in kernels:
            print(report(f"{case}{tag}:{kname.strip('_')}", kernel, args.dump), flush=True)
    return 0




def check_test_matrix() -> int:
    """Compile every decode case of tests/test_kernels_gpu.py offline; report any that would not fit an SM."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    import test_kernels_gpu as t
    _compile_only()
    worst, bad = 0, 0
    for (fmt, placement), config, (batch, (num_heads, kv_heads), head_size) in t.DECODE_CASES:
        kv_cache_dtype, dtype = fmt
        layout = KVLayout(kv_cache_dtype, dtype, kv_heads, head_size, 16, placement)
        configs = t.ROW_CONFIGS if (fmt, placement) in t.ROW_FORMATS else t.DECODE_CONFIGS
        cfg = launch.decode_config(batch, kv_heads, num_heads // kv_heads, head_size, layout.elem_bytes, 1024,
                                   torch.device("cuda"), fmt=layout.fmt, placement=layout.placement, sms=H200_SMS)
        cfg = dataclasses.replace(cfg, **configs[config](cfg, head_size * layout.elem_bytes))
        COMPILED.clear()
        start = time.perf_counter()
        q = torch.zeros(batch, num_heads, head_size, dtype=dtype)
        dec.paged_decode_attention(q, torch.zeros(64, layout.block_bytes, dtype=torch.uint8),
                                   torch.zeros(batch, 64, dtype=torch.int32), torch.full((batch,), 1000, dtype=torch.int32),
                                   layout, 0.1, validate=False, config=cfg)
        took = time.perf_counter() - start
        for name, kernel in COMPILED:
            shared = kernel.metadata.shared
            worst = max(worst, shared)
            flag = shared > 232448
            bad += flag
            print(f"{'TOO BIG ' if flag else ''}{kv_cache_dtype}/{dtype}/{placement} {config} d{head_size}: {name} "
                  f"smem {shared} ({took:.1f} s)", flush=True)
    print(f"largest shared memory {worst} bytes (limit 232448); {bad} too big")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(check_test_matrix() if "--tests" in sys.argv else main())
