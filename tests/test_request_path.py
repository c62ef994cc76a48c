"""The request path as a reader follows it: the files one decode step runs through, their lines, and the calls
from a model's attention op to the kernel. CONTRIBUTING.md ("The request path") states the numbers and the
limits this test keeps; print them with

    python -m pytest -q -s tests/test_request_path.py

A decode step of tiny-gemma4 with an int8 per-token-head cache through the Triton backend (the interpreter on a
CPU) is traced with `sys.settrace` (calls only, no line events): every Python call into a file of minikv/ or kernels/ is recorded, and for the
first call into kernels/ made under a model's attention op, the minikv frames between the two are counted.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import minikv

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = (ROOT / "minikv", ROOT / "kernels")
# What the path is today (20 files, 4,392 lines, 4 calls), kept from growing. The readable-core work aimed at 15
# files and 4,000 lines; the 20 are one concept each (CONTRIBUTING.md, "The request path", says which and why).
MAX_FILES, MAX_LINES, MAX_HOPS = 20, 4400, 4


@functools.cache
def _in_repo(filename: str) -> Path | None:
    path = Path(filename).resolve()
    return path if any(d in path.parents for d in PACKAGE_DIRS) else None


def trace_one_decode_step() -> tuple[dict[Path, int], int]:
    """(file -> its line count, for every minikv/kernels file the step called into; hops from the attention op
    to the kernel entry point)."""
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=2, backend="triton")
    llm.add_request("3 7 11 15", minikv.SamplingParams(temperature=0, max_tokens=4))
    llm.step()                                              # the prefill: compiled and warm before the trace
    files: set[Path] = set()
    hops: list[int] = []

    def on_call(frame, event, arg):             # a global trace function: called for every new Python frame
        path = _in_repo(frame.f_code.co_filename)
        if path is None:
            return None                         # None: no line events for this frame
        files.add(path)
        if hops or ROOT / "kernels" not in path.parents:
            return None
        # The first call into kernels/: walk back to the model's attention op, counting minikv's frames.
        count, f = 0, frame
        while f is not None:
            caller = _in_repo(f.f_code.co_filename)
            if caller is not None and caller.name == "layers.py" and f.f_code.co_name == "forward" \
                    and type(f.f_locals.get("self")).__name__ == "Attention":
                hops.append(count)
                return None
            if caller is not None:
                count += 1
            f = f.f_back

    sys.settrace(on_call)
    try:
        out = llm.step()
    finally:
        sys.settrace(None)
    assert out.phase == "decode"
    return {p: len(p.read_text().splitlines()) for p in sorted(files)}, (hops[0] if hops else -1)


def test_one_decode_step_is_a_short_chain_of_calls():
    files, hops = trace_one_decode_step()
    lines = sum(files.values())
    print(f"\none decode step: {len(files)} files, {lines} lines; {hops} calls from the attention op to the kernel")
    for path, n in files.items():
        print(f"  {n:5d}  {path.relative_to(ROOT)}")
    assert hops >= 1, "the trace never reached kernels/ from a model's attention op"
    assert len(files) <= MAX_FILES and lines <= MAX_LINES and hops <= MAX_HOPS, \
        f"{len(files)} files (at most {MAX_FILES}), {lines} lines (at most {MAX_LINES}), {hops} hops (at most {MAX_HOPS})"
