"""Defect B1 as a GPU bounds checker sees it: one engine run per process, meant to run under
`compute-sanitizer --tool memcheck` on a CUDA GPU (`bash tools/gpu.sh memcheck` does), with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 so that every torch allocation is its own cudaMalloc, as memcheck needs to know
where an allocation ends.

    python tools/memcheck_cross_stride.py reference OUT.json       # the auto-cache run's token ids (no sanitizer)
    python tools/memcheck_cross_stride.py CASE --reference OUT.json  # one case; prints one JSON line

Cases (tiny-t5, bf16 on CUDA, fp8 cache, triton kernels, the arena's sanitizer off so nothing but memcheck looks):
  one-arena-historical-1.5x   every pool in one allocation: the doubled stride runs into the next pool, inside the
                              allocation, so memcheck has nothing to report and the tokens come out silently wrong
  per-pool-historical-1.5x    each pool its own exact allocation (as TensorRT-LLM's pool manager): the overrun leaves
                              the allocation and memcheck reports out-of-bounds accesses (upstream's symptom)
  per-pool-fixed-1.5x         the fixed backend on the same pools: no report, tokens equal the auto-cache run
  per-pool-historical-2x      the historical stride on a pool of twice the blocks needed: in bounds, no report
On CPU the same script runs without a sanitizer (a dry run): there the per-pool arena keeps a guard after each pool
(see minikv.cache.arena.SeparateKVArena), so the historical case writes its guard and harms nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from minikv.repro import cross_stride

CASES = {
    "one-arena-historical-1.5x": dict(kv_arena="one", buggy=True, factor=1.5),
    "per-pool-historical-1.5x": dict(kv_arena="per-pool", buggy=True, factor=1.5),
    "per-pool-fixed-1.5x": dict(kv_arena="per-pool", buggy=False, factor=1.5),
    "per-pool-historical-2x": dict(kv_arena="per-pool", buggy=True, factor=2.0),
}


def prompts() -> list[str]:
    """Three tiny-t5 prompts of 12 characters: short answers keep the run short under the sanitizer."""
    return cross_stride.task_of().prompts(3, seed=0, num_tokens=12)


def device_and_backend() -> tuple[str, str]:
    return ("cuda", "triton") if torch.cuda.is_available() else ("cpu", "torch")


def reference(path: Path) -> None:
    device, backend = device_and_backend()
    ps = prompts()
    tokens = cross_stride.reference_tokens(ps, device, backend)
    need = cross_stride.engine("fp8", device, backend).cross_blocks_needed(ps)
    path.write_text(json.dumps({"prompts": ps, "tokens": tokens, "need": need}))
    print(f"reference: {len(ps)} requests, {need} cross blocks needed, written to {path}")


def run_case(name: str, ref: dict) -> dict:
    import minikv
    device, backend = device_and_backend()
    case = CASES[name]
    blocks = max(1, math.floor(case["factor"] * ref["need"]))
    llm = cross_stride.engine("fp8", device, backend, max_num_seqs=len(ref["prompts"]), cross_pool_blocks=blocks,
                              sanitize=False, repro=minikv.ReproConfig(check_layout=False, kv_arena=case["kv_arena"]),
                              reintroduce=("cross-stride",) if case["buggy"] else ())
    result = {"case": name, "device": device, "cross_pool_blocks": blocks, "blocks_needed": ref["need"],
              "arena": type(llm.arena).__name__}
    try:
        tokens = cross_stride.generate_tokens(llm, ref["prompts"])
        if device == "cuda":
            torch.cuda.synchronize()
        result["wrong_requests"] = [i for i, (t, r) in enumerate(zip(tokens, ref["tokens"])) if t != r]
        result["guard_bytes_written_after"] = [d[0] for d in llm.arena.damaged_guards()]
        result["error"] = None
    except (RuntimeError, minikv.KVCacheOverrunError) as err:     # a CUDA error once memcheck stopped a kernel
        result["error"] = str(err).splitlines()[0][:300]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=("reference", *CASES))
    p.add_argument("path", nargs="?", help="reference: where to write the auto-cache run's token ids")
    p.add_argument("--reference", help="a case: the file `reference` wrote")
    args = p.parse_args(argv)
    if args.case == "reference":
        reference(Path(args.path))
        return 0
    ref = json.loads(Path(args.reference).read_text())
    print("RESULT " + json.dumps(run_case(args.case, ref)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
