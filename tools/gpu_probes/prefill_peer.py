"""Prefill beside transformers' own (issue 37, target 4), on one checkpoint in one process.

transformers builds a random gemma-4-E2B text model (tools/random_checkpoints.gemma4_config("e2b"), full vocabulary)
and saves it in bf16 with a tokenizer.json; 64 prompts of 2,048 random token ids are then run through
  * transformers: `model(ids, logits_to_keep=1)` in bf16 (what its generate does for the prompt), eager;
  * minikv: `LLM.generate(..., max_tokens=1)` on the same directory, for each step budget (max_num_batched_tokens:
    how many prompt tokens one engine step takes) given on the command line, without and with
    kv_sharing_fast_prefill (the 20 KV-sharing layers on each prompt's last token only, as transformers' forward
    with logits_to_keep=1 does).
Each is timed 3 times after a warm-up (median, min and max printed); then torch.profiler splits one run of each into
GPU kernel time and the rest (the host), so a gap can be placed. Needs transformers (carried in .whl/).

    python tools/gpu_probes/prefill_peer.py DIR [BUDGET ...]     # default budgets: 16384 65536
    DRY=1 python tools/gpu_probes/prefill_peer.py DIR 128        # a dry run on CPU at tiny dimensions
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools import random_checkpoints

BATCH, LENGTH, REPEATS = 64, 2048, 3
DRY = os.environ.get("DRY") == "1"          # a dry run on CPU: tiny dimensions, 4 prompts of 64 tokens
DEVICE = "cpu" if DRY else "cuda"
if DRY:
    BATCH, LENGTH, REPEATS = 4, 64, 1


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build(path: Path) -> None:
    import transformers
    random_checkpoints.build_tokenizer(path)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        hf = transformers.Gemma4ForCausalLM(random_checkpoints.gemma4_config("tiny" if DRY else "e2b", 400))
    hf = hf.to(torch.bfloat16).eval()
    hf.save_pretrained(path, max_shard_size="4GB")
    print(f"checkpoint: {sum(p.numel() for p in hf.parameters()) / 1e9:.2f} B parameters", flush=True)


def timed(fn) -> tuple[float, float, float]:
    fn()                                                        # warm-up (compiles, allocator)
    times = []
    for _ in range(REPEATS):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def profiled(fn, label: str) -> None:
    """GPU kernel time against wall time of one run, and the largest kernels."""
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - start
    kind = torch.autograd.DeviceType.CUDA if DEVICE == "cuda" else torch.autograd.DeviceType.CPU
    events = [e for e in prof.key_averages() if e.device_type == kind]
    gpu = sum(e.self_device_time_total for e in events) / 1e6
    launches = sum(e.count for e in events)
    print(f"  {label}: wall {wall:.3f} s (under the profiler), GPU kernels {gpu:.3f} s in {launches} launches",
          flush=True)
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:8]:
        print(f"    {e.self_device_time_total / 1e3:8.1f} ms {e.count:6d}x  {e.key[:90]}")


def main(path: str, *budgets: str) -> int:
    path = Path(path)
    if not (path / "config.json").exists():
        build(path)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (BATCH, LENGTH), generator=g)
    tokens = BATCH * LENGTH
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)"
    print(f"device: {name}; {BATCH} prompts x {LENGTH} tokens = {tokens:,}", flush=True)

    their_rate = transformers_prefill(path, ids)
    for budget in [int(b) for b in budgets] or [16384, 65536]:
        for fast in (False, True):
            minikv_prefill(path, ids, budget, their_rate, fast)
    return 0


def transformers_prefill(path: Path, ids: torch.Tensor) -> float:
    import transformers
    hf = transformers.Gemma4ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(DEVICE).eval()
    dev_ids = ids.to(DEVICE)

    def theirs():
        with torch.no_grad():
            hf(dev_ids, logits_to_keep=1)
    med, lo, hi = timed(theirs)
    print(f"transformers {transformers.__version__} forward (logits_to_keep=1, eager, sdpa): median {med:.3f} s "
          f"({ids.numel() / med / 1e3:.1f}k tokens/s; min {lo:.3f}, max {hi:.3f})", flush=True)
    profiled(theirs, "transformers")
    return ids.numel() / med


def minikv_prefill(path: Path, ids: torch.Tensor, budget: int, their_rate: float, fast: bool) -> None:
    import minikv
    tokens = ids.numel()
    prompts = [{"prompt_token_ids": row} for row in ids.tolist()]
    params = minikv.SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm = minikv.LLM(model=str(path), dtype=torch.bfloat16, device=DEVICE, max_num_seqs=ids.shape[0],
                     max_num_batched_tokens=budget, max_model_len=ids.shape[1] + 16, sanitize=False,
                     kv_sharing_fast_prefill=fast)

    def ours():
        llm.generate(prompts, params, use_tqdm=False)
    med, lo, hi = timed(ours)
    print(f"minikv, step budget {budget:>6} tokens ({-(-tokens // budget)} steps), kv_sharing_fast_prefill={fast}: "
          f"median {med:.3f} s "
          f"({tokens / med / 1e3:.1f}k tokens/s, {tokens / med / their_rate:.2f}x transformers'; min {lo:.3f}, "
          f"max {hi:.3f})", flush=True)
    profiled(ours, f"minikv at {budget}, fast={fast}")


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
