"""Prefill of two or more minikv trees beside transformers' own, on one checkpoint in one call (CUDA machine):

    python tools/gpu_probes/prefill_ab.py TREE [TREE ...]      # a TREE holds minikv/ (and minikv/kernels linked)

The checkpoint and prompts of `minikv bench engine --peer transformers` (minikv.bench.transformers_peer: a random
gemma-4-E2B text model built by transformers, 64 prompts of 2,048 random token ids, seed 0). transformers' prefill
is its forward with logits_to_keep=1, median of 3 after a warm-up; each tree's rows come from its own
`minikv_row` (without and with kv_sharing_fast_prefill, 4 new tokens), run in a subprocess started in that tree,
so each imports its own minikv (PYTHONPATH must hold this repository, for this script's own imports). Prints one
line per row and each prefill's ratio to transformers'. First run on a GPU: results/gpu/block-placement-engine-
2026-12-07-h100. DRY=1 runs it on CPU at tiny dimensions (4 prompts of 64 tokens).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from minikv.bench import transformers_peer as peer

DRY = os.environ.get("DRY") == "1"
DEVICE, SHAPE = ("cpu", (4, 64)) if DRY else ("cuda", (64, 2048))
TINY = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 10,
        "num_kv_shared_layers": 5, "head_dim": 16, "global_head_dim": 32, "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": 512}
ROW = """
import json, sys, torch, minikv
from minikv.bench.transformers_peer import minikv_row
ids = torch.load(sys.argv[1])
for fast in (False, True):
    r = minikv_row(sys.argv[2], ids, 4, fast, device=sys.argv[3])
    print("ROW", json.dumps({**r, "minikv": minikv.__file__}), flush=True)
"""


@torch.no_grad()
def transformers_prefill_s(transformers, path, ids) -> float:
    model = transformers.Gemma4ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(DEVICE).eval()
    return peer._median_s(lambda: model(ids.to(DEVICE), logits_to_keep=1), DEVICE)


def main(trees: list[str]) -> None:
    with tempfile.TemporaryDirectory() as path:
        peer.build_checkpoint(path, DEVICE, **(TINY if DRY else {}))
        vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
        ids = torch.randint(3, vocab, SHAPE, generator=torch.Generator().manual_seed(0))
        torch.save(ids, Path(path) / "ids.pt")
        transformers = peer.import_transformers()
        theirs = transformers_prefill_s(transformers, path, ids)
        peer._free(DEVICE)                                  # the model went with the function's frame
        print(f"transformers {transformers.__version__}, forward with logits_to_keep=1: prefill {theirs:.3f} s "
              f"({ids.numel() / theirs:.0f} tokens/s)", flush=True)
        for tree in trees:
            out = subprocess.run([sys.executable, "-c", ROW, str(Path(path) / "ids.pt"), path, DEVICE], cwd=tree,
                                 capture_output=True, text=True, check=False)
            rows = [json.loads(line[4:]) for line in out.stdout.splitlines() if line.startswith("ROW ")]
            if out.returncode or len(rows) != 2:
                print(f"{tree}: failed (rc {out.returncode})\n{out.stderr[-2000:]}", flush=True)
                continue
            for r in rows:
                print(f"{tree:16s} {r['engine']:36s} prefill {r['prefill_s']:.3f} s ({r['prefill_tokens_per_s']:.0f}"
                      f" tokens/s, {theirs / r['prefill_s']:.3f}x transformers'); decode {r['decode_ms_per_step']:.2f}"
                      f" ms per step; minikv from {r['minikv']}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])
