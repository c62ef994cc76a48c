"""The kernels' mode on a machine without a GPU: the interpreter runs them even when triton was imported first,
and a Triton too old to interpret them is refused in one line when the engine is built. Programmatic dependent
launch (compiled only): every kernel launched with it waits for the kernel ahead before touching memory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minikv.kernels import KernelModeError, mode

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter is chosen only where no GPU is visible")
def test_triton_imported_before_minikv_still_interprets():
    # triton's own @jit helpers (tl.cdiv, tl.max, ...) are then defined compiled; mode.py redefines them
    code = ("import triton, minikv\n"
            "p = minikv.SamplingParams(temperature=0, max_tokens=3)\n"
            "ids = [minikv.LLM(model='tiny-gemma4', backend=b, kv_cache_dtype='int8_per_token_head', max_num_seqs=2)"
            ".generate(['3 7 11 15'], p, use_tqdm=False)[0].outputs[0].token_ids for b in ('triton', 'torch')]\n"
            "print(ids[0] == ids[1], len(ids[0]))\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**env, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "3"], done.stdout


@pytest.mark.parametrize("version, refused", [("3.6.0", True), ("3.7.1", False), ("3.9.0", False),
                                              ("3.10.0+git1234", False)])
def test_a_triton_too_old_to_interpret_is_named(monkeypatch, version, refused):
    import triton
    monkeypatch.setattr(triton, "__version__", version)
    problem = mode.interpreter_problem()
    assert (problem is not None) == refused
    if refused:
        assert "triton>=3.7" in problem and version in problem and "\n" not in problem


@pytest.mark.skipif(not mode.INTERPRETED, reason="the check guards the interpreter only")
def test_the_engine_refuses_an_old_triton_before_any_kernel_runs(monkeypatch):
    import triton
    from minikv.attention.backend import get_ops
    monkeypatch.setattr(triton, "__version__", "3.6.0")
    with pytest.raises(KernelModeError, match=r"triton>=3\.7.*backend='torch'"):
        get_ops("triton")
    assert get_ops("torch").name == "torch"


def _pdl_launches_and_first_calls() -> tuple[set[str], dict[str, str]]:
    """The kernels launched with launch.PDL_LAUNCH in kernels/, and each @triton.jit function's first statement."""
    import ast
    launched, first = set(), {}
    for path in (ROOT / "kernels").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) \
                    and any(ast.unparse(k) == "**launch.PDL_LAUNCH" for k in node.keywords):
                launched.add(ast.unparse(node.func.value))
            if isinstance(node, ast.FunctionDef) and any("triton.jit" in ast.unparse(d) for d in node.decorator_list):
                body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                first[node.name] = ast.unparse(body[0])
    return launched, first


def test_every_dependent_launch_waits_before_touching_memory():
    """A kernel launched with PDL_LAUNCH may start before the kernel ahead of it has finished: its first statement
    must be the wait (launch.wait_for_inputs), or it could read what that kernel has not yet written."""
    launched, first = _pdl_launches_and_first_calls()
    assert {"_decode_kernel", "_merge_splits_kernel", "_rms_norm_kernel", "_decode_matmul_kernel",
            "_write_kv_kernel"} <= launched
    assert {name: first[name] for name in launched if first[name] != "launch.wait_for_inputs()"} == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the interpreter's choice")
def test_the_interpreter_never_uses_dependent_launch():
    code = "from minikv.kernels import launch; print(launch.PDL)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MINIKV_PDL": "1", "TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]
