"""Full-size random checkpoints on a CUDA GPU: transformers builds gemma-4-E2B's text model (5.1 B parameters) or a
flan-t5-base-sized T5, saves it as a bf16 checkpoint directory with a tokenizer.json (tools/random_checkpoints.py),
and minikv loads that directory and matches transformers' logits (`bash tools/gpu.sh fidelity` runs it).

    python tools/fullsize_parity.py gemma4 DIR       # gemma-4-E2B's dimensions, sharded into 2 GB files
    python tools/fullsize_parity.py t5 DIR           # flan-t5-base's dimensions, one file
    python tools/fullsize_parity.py gemma4 DIR tiny cpu    # a dry run at small dimensions on CPU

The truth is transformers in float32 with the checkpoint's (bf16-rounded) weights; minikv's bf16 logits may be off
from it by at most twice transformers' own bf16 error plus 1% of the logits' scale (tests/test_parity_gpu.py's
rule), at the context step and at every decode step; the prompt is longer than E2B's 512-token window.
"""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minikv.models.hf_checkpoint import load_checkpoint
from tests.test_parity_gpu import _decoder_logits, within_bf16
from tools import random_checkpoints


def main(kind: str, path: str, dims: str | None = None, device: str = "cuda") -> int:
    import transformers
    start = time.perf_counter()
    dims = dims or ("e2b" if kind == "gemma4" else "flan-t5-base")
    path = Path(path)
    random_checkpoints.build_tokenizer(path)
    torch.manual_seed(0)
    vocab = -(-len(json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]) // 64) * 64
    with torch.device(device):
        if kind == "gemma4":
            hf = transformers.Gemma4ForCausalLM(random_checkpoints.gemma4_config(dims, vocab)).eval()
        else:
            hf = transformers.T5ForConditionalGeneration(random_checkpoints.t5_config(dims, vocab)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.bfloat16().float())            # the checkpoint's weights, exactly, in float32
    params = sum(p.numel() for p in hf.parameters())
    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16)
    hf_bf16.save_pretrained(path, max_shard_size="2GB")
    saved = time.perf_counter()
    files = sorted(f.name for f in path.iterdir())
    print(f"{kind} at {dims} dimensions: {params / 1e9:.2f} B parameters, written in {saved - start:.0f} s: "
          f"{', '.join(files)}", flush=True)
    ours = load_checkpoint(path, device=device, dtype=torch.bfloat16)
    print(f"minikv loaded it in {time.perf_counter() - saved:.0f} s", flush=True)
    config = json.loads((path / "config.json").read_text())
    g = torch.Generator().manual_seed(0)
    vocab = config["vocab_size"]
    with torch.no_grad():
        length, prefill = (600, 590) if dims == "e2b" else (24, 8)
        ids = torch.randint(3, vocab, (2, length), generator=g).to(device)
        args = (ids, prefill) if kind == "gemma4" else \
            (ids, prefill, torch.randint(3, vocab, (2, 15), generator=g).to(device))
        truth = _decoder_logits(True, hf, *args).float()
        theirs = _decoder_logits(True, hf_bf16, *args)
        mine = _decoder_logits(False, ours, *args)
    try:
        ours_err, their_err = within_bf16(mine, theirs, truth)
        verdict, code = "within the bound", 0
    except AssertionError as err:
        (ours_err, their_err, _), verdict, code = err.args[0], "OUTSIDE the bound", 1
    steps = args[0].shape[1] - args[1]
    print(f"PARITY {kind} {dims}: bf16 max |logit error| against transformers float32: minikv {ours_err:.3g}, "
          f"transformers {their_err:.3g} (logits' scale {float(truth.abs().max()):.3g}; context step of "
          f"{args[1]} tokens + {steps} decode steps); {verdict} (2x transformers' + 1% of the scale); "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
