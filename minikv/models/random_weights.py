"""The shipped checkpoints that are not trained: random weights, rebuilt byte for byte from a seed.
See docs/internals.md#models-random-weights."""
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
