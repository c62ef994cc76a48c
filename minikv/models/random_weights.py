"""The shipped checkpoints that are not trained: random weights, rebuilt byte for byte from a seed.

`tiny-gemma4-e2b` has gemma-4-E2B's text topology (see `minikv.models.registry`) and random weights. Training it
on the arithmetic task does not fit this project's CPU budget: one training step (tiny-gemma4's recipe, batch 32
of 112 tokens, one thread) measured 36 s against tiny-gemma4's 1.3 s on the same loaded machine, so the 1,500
steps tiny-gemma4 needs would take about 15 hours. What it is shipped for does not need training: which layers
fill which storage's scale regions, and when, is decided by the layer topology and the engine's warmup, never by
the weights. What a random model cannot show is an objectively wrong answer, so the scale-wipe reproduction calls
a request of such a model damaged when its tokens differ from the fixed engine's (and it generates with
`ignore_eos`, since a random model may end any answer at once).

    python -m minikv.models.random_weights tiny-gemma4-e2b            # rewrites minikv/models/weights/tiny-gemma4-e2b/
    python -m minikv.models.random_weights tiny-gemma4-e2b --out-dir build/weights

The weights are transformers' initialization for Gemma-4 (normal, std 0.02, for every linear layer and embedding;
norms and layer scalars 1), drawn after `torch.manual_seed(seed)`, stored as float16 with the digest file the
loader checks, and a `random_init.json` that records how they were made.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from minikv.models import hf_checkpoint, registry
from minikv.models.dir_tokenizer import save_char_tokenizer

RECIPE_FILE = "random_init.json"
SEED = 0


def build(name: str, seed: int = SEED) -> torch.nn.Module:
    """The float32 model `name` with its random weights (the same every call for the same seed)."""
    from minikv.models.train import init_weights
    if name not in registry.RANDOM_WEIGHT_MODELS:
        raise ValueError(f"{name!r} is not a random-weight model; those are {', '.join(registry.RANDOM_WEIGHT_MODELS)}")
    torch.manual_seed(seed)
    model = registry.build_model(name)
    init_weights(model)
    return model.eval()


def write_checkpoint(name: str, out_dir: str | Path | None = None, seed: int = SEED) -> Path:
    """Write `name`'s checkpoint directory (config.json, model.safetensors in float16, minikv_sha256.json,
    minikv_tokenizer.json, random_init.json) into `out_dir` (None: the package's weights folder)."""
    model = build(name, seed)
    path = registry.checkpoint_dir(name, out_dir)
    hf_checkpoint.save_checkpoint(model, path, dtype=registry.STORAGE_DTYPE)
    save_char_tokenizer(registry.get_tokenizer(name), path)
    recipe = {"weights": "random, not trained", "seed": seed,
              "init": "transformers' Gemma-4 initialization: normal(0, 0.02) for every linear layer and embedding; "
                      "norm weights and layer scalars 1",
              "stored_as": str(registry.STORAGE_DTYPE).removeprefix("torch."),
              "why": "the scale-fill census depends on the layer topology and the warmup, not on the weights; "
                     "training at E2B's head sizes measured 36 s per step on the 2-core CPU (about 15 hours)",
              "rebuild": f"python -m minikv.models.random_weights {name}"}
    (path / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
    for written in path.iterdir():
        written.chmod(0o644)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minikv.models.random_weights", description=__doc__.splitlines()[0])
    p.add_argument("model", choices=registry.RANDOM_WEIGHT_MODELS)
    p.add_argument("--out-dir", default=None, help="default: the package's weights folder")
    p.add_argument("--seed", type=int, default=SEED)
    args = p.parse_args(argv)
    print(f"written to {write_checkpoint(args.model, args.out_dir, args.seed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
