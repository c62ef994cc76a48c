"""The request path: the files one decode step runs through, their lines, and the calls from a model's attention
op to the kernel. The limits live here; CONTRIBUTING.md ("The request path") states them, and this test prints
the measured numbers: `python -m pytest -q -s tests/test_request_path.py`.

A decode step of tiny-gemma4 (int8 per-token-head cache, Triton backend) is traced with `sys.settrace`, calls only.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minikv

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = (ROOT / "minikv", ROOT / "kernels")
# 4,160 lines until issue 37's transposed-V tile for the "block" placement (decode_attention._block_tile and its
# addressing: +73), which the issue allows: its kernel work may add @triton.jit helpers beside the decode kernel.
MAX_FILES, MAX_LINES, MAX_HOPS = 22, 4240, 4
# What a GPU decode step adds to the CPU's path: the CUDA-graph replay, the fused RMSNorm and the fused matmuls. They
# are counted on every machine, so the CPU and the GPU path keep one limit; test_gpu_path_adds_only_these checks it.
GPU_ONLY = (ROOT / "minikv/engine/cuda_graph.py", ROOT / "kernels/rms_norm.py", ROOT / "kernels/decode_matmul.py")


@functools.cache
def _in_repo(filename: str) -> Path | None:
    path = Path(filename).resolve()
    return path if any(d in path.parents for d in PACKAGE_DIRS) else None


def _is_attention_op(frame) -> bool:
    return frame.f_code.co_filename.endswith("layers.py") and frame.f_code.co_name == "forward" \
        and type(frame.f_locals.get("self")).__name__ == "Attention"


def trace_one_decode_step(**engine_kw) -> tuple[set[Path], int]:
    """The minikv/kernels files one decode step called into, and the minikv frames from the attention op to the
    first kernel entry point (-1 when no attention op ran in Python, as in a CUDA-graph replay)."""
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=2, backend="triton",
                     **engine_kw)
    llm.add_request("3 7 11 15", minikv.SamplingParams(temperature=0, max_tokens=4))
    llm.step()                                  # the prefill: compiled and warm before the trace
    files: set[Path] = set()
    hops: list[int] = []

    def on_call(frame, event, arg):
        path = _in_repo(frame.f_code.co_filename)
        if path is None:
            return None                         # None: no line events for this frame
        files.add(path)
        if hops or ROOT / "kernels" not in path.parents:
            return None
        count, f = 0, frame                     # the first call into kernels/: walk back to the attention op
        while f is not None and not _is_attention_op(f):
            count += _in_repo(f.f_code.co_filename) is not None
            f = f.f_back
        if f is not None:
            hops.append(count)
        return None

    sys.settrace(on_call)
    try:
        out = llm.step()
    finally:
        sys.settrace(None)
    assert out.phase == "decode"
    return files, (hops[0] if hops else -1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="traces the CPU path, whose kernels a GPU machine compiles "
                    "for CUDA only; test_gpu_path_is_within_the_same_limits measures the GPU's")
def test_one_decode_step_is_a_short_chain_of_calls():
    files, hops = trace_one_decode_step()
    files |= set(GPU_ONLY)
    counts = {p: len(p.read_text().splitlines()) for p in sorted(files)}
    lines = sum(counts.values())
    print(f"\none decode step (CPU path + {len(GPU_ONLY)} GPU-only files): {len(files)} files, {lines} lines; "
          f"{hops} calls from the attention op to the kernel")
    for path, n in counts.items():
        print(f"  {n:5d}  {path.relative_to(ROOT)}")
    assert hops >= 1, "the trace never reached kernels/ from a model's attention op"
    assert len(files) <= MAX_FILES and lines <= MAX_LINES and hops <= MAX_HOPS, \
        f"{len(files)} files (at most {MAX_FILES}), {lines} lines (at most {MAX_LINES}), {hops} hops (at most {MAX_HOPS})"


def test_contributing_states_these_limits():
    text = " ".join((ROOT / "CONTRIBUTING.md").read_text().split())
    section = text[text.index("**The request path.**"):]
    for stated in (f"{MAX_FILES} files", f"{MAX_LINES:,} lines", f"{MAX_HOPS} calls"):
        assert stated in section, f"CONTRIBUTING.md's request path section should state the limit {stated!r}"
    assert not re.search(r"\b\d,\d{3} lines \(", section[:1500]), "CONTRIBUTING states limits, not a measured count"


def _cpu_path_in_a_process_without_cuda() -> set[Path]:
    """The CPU path's files, traced where the kernels run in Triton's interpreter: a process that sees no GPU."""
    code = ("import sys; sys.path.insert(0, 'tests'); import test_request_path as t; "
            "print('\\n'.join(map(str, t.trace_one_decode_step()[0])))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, f"tracing the CPU path failed:\n{done.stderr[-3000:]}"
    return {Path(line) for line in done.stdout.splitlines() if line.strip()}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_path_is_within_the_same_limits():
    graphed, _ = trace_one_decode_step(device="cuda")
    eager, hops = trace_one_decode_step(device="cuda", enforce_eager=True)
    files = graphed | eager
    lines = sum(len(p.read_text().splitlines()) for p in files)
    print(f"\none GPU decode step (graphed and eager): {len(files)} files, {lines} lines, {hops} hops")
    assert len(files) <= MAX_FILES and lines <= MAX_LINES and 1 <= hops <= MAX_HOPS, (len(files), lines, hops)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_path_adds_only_these():
    from minikv.kernels import mode
    if mode.interpreter_problem():
        pytest.skip(f"the CPU path cannot be traced here: {mode.interpreter_problem()}")
    cpu_files = _cpu_path_in_a_process_without_cuda()
    graphed, _ = trace_one_decode_step(device="cuda")
    eager, hops = trace_one_decode_step(device="cuda", enforce_eager=True)
    extra = (graphed | eager) - cpu_files - set(GPU_ONLY)
    assert not extra, f"a GPU decode step also runs {sorted(str(p.relative_to(ROOT)) for p in extra)}"
    assert 1 <= hops <= MAX_HOPS, hops
