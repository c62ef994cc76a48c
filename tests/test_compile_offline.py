"""The decode kernel's compiled path, which the interpreter never takes, compiles for an H100/H200 (sm_90) on a
machine without a GPU (tools/gpu_compile.py, in a process of its own: it imports the kernels in compiled mode)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[1]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
SM90_SHARED_BYTES = 232448
# gemma-4-E2B's full layer read by token class (ROW_WINDOW's period 4), its bf16 twin, and the 16-byte-slot window
CASES = ("fp8pth-512", "auto-512", "int8-row")


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build ships no ptxas")
def test_the_decode_kernel_compiles_for_sm90():
    run = subprocess.run([sys.executable, "tools/gpu_compile.py", "--case", *CASES], cwd=ROOT, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    reports = {line.split(":")[0]: line for line in run.stdout.splitlines() if ":decode_kernel " in line}
    assert set(reports) == set(CASES), run.stdout
    for case, line in reports.items():
        regs, smem = int(re.search(r"regs\s+(\d+)", line).group(1)), int(re.search(r"smem\s+(\d+)", line).group(1))
        assert 0 < regs <= 255 and 0 < smem <= SM90_SHARED_BYTES, line
        assert "HMMA" in line, line                   # the dot products became tensor-core instructions
