"""Checkpoints as a user would first try minikv on: small Gemma-4 (text) and T5 models saved by transformers in
float32, bfloat16 or float16, with transformers' own default initialization or randomized weights, each with its
own byte-level BPE tokenizer.json. Deterministic (seeded); what the hunter's false-alarm sweep runs on.

    python tools/user_checkpoints.py DIR [--only NAME ...]     # writes DIR/NAME for every checkpoint in CHECKPOINTS
    python tools/user_checkpoints.py DIR --sweep [--jobs 2]    # and hunts each on the fixed engine, seeds 0 to 2

The sweep runs `minikv hunt --model DIR/NAME --budget 60 --seed S`, `--jobs` at a time (one thread each), and
writes results/hunt_user_checkpoints.json (a table per checkpoint, and the false alarms counted) and its log.
transformers is a dev dependency: this tool uses it, minikv never does at run time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools.random_checkpoints import F, S, build_tokenizer, t5_config

# name -> (kind, weights, dtype): "default" is transformers' own initialization, "random" every parameter drawn.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECKPOINTS = {f"{kind}-{weights}-{name}": (kind, weights, dtype)
               for kind in ("gemma4", "t5") for weights in ("default", "random") for name, dtype in DTYPES.items()}


def gemma4_config(vocab: int):
    """A small Gemma-4 text model: 6 layers (the last 2 share K/V), heads of 16 and 32 (global), vocabulary `vocab`."""
    import transformers
    return transformers.Gemma4TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, global_head_dim=32, layer_types=[S, S, F, S, S, F], sliding_window=16,
        num_kv_shared_layers=2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab,
        final_logit_softcapping=30.0, max_position_embeddings=256, pad_token_id=0, eos_token_id=1, bos_token_id=2,
        attn_implementation="sdpa")


def write(name: str, path: str | Path, seed: int = 0) -> Path:
    """Checkpoint `name` (a key of CHECKPOINTS) saved by transformers into `path`, tokenizer.json beside it."""
    import transformers
    kind, weights, dtype = CHECKPOINTS[name]
    path = Path(path)
    tokenizer = build_tokenizer(path, vocab_size=300, seed=seed)
    vocab_size = -(-len(json.loads(tokenizer.read_text())["model"]["vocab"]) // 64) * 64
    torch.manual_seed(seed)
    if kind == "gemma4":
        model = transformers.Gemma4ForCausalLM(gemma4_config(vocab_size))
    else:
        model = transformers.T5ForConditionalGeneration(t5_config("tiny", vocab_size))
    if weights == "random":
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.25) + (p.dim() == 1))
    model.to(dtype).eval().save_pretrained(path)
    return path


REPO = Path(__file__).resolve().parent.parent


def sweep(root: Path, names, seeds=(0, 1, 2), budget: float = 60.0, out: Path = REPO / "results",
          command: str = "", jobs: int = 1) -> dict:
    """Hunt every checkpoint under `root` with every seed on the fixed engine, `jobs` hunts at a time (each on one
    thread); write the summary and the log (in order, whatever order the hunts end in)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}

    def one(name_seed):
        name, seed = name_seed
        report = root / f"{name}.seed{seed}.json"
        argv = [sys.executable, "-m", "minikv", "hunt", "--model", str(root / name), "--budget", f"{budget:g}",
                "--seed", str(seed), "--results", str(report)]
        start = time.monotonic()
        done = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, cwd=REPO)
        print(f"{name} seed {seed}: exit {done.returncode}", flush=True)
        return (f"$ minikv hunt --model {name} --budget {budget:g} --seed {seed}  (exit {done.returncode}, "
                f"{time.monotonic() - start:.0f} s)\n{done.stdout}{done.stderr}\n",
                json.loads(report.read_text()) if report.exists() else {}, done.returncode)

    from concurrent.futures import ThreadPoolExecutor
    hunts = [(name, seed) for name in names for seed in seeds]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        done = dict(zip(hunts, pool.map(one, hunts)))
    rows, alarms, scenarios = [], 0, 0
    with (out / "cpu" / "hunt_user_checkpoints.log").open("w") as log:
        for name in names:
            outcomes, runs, used = [], 0, 0.0
            for seed in seeds:
                text, data, code = done[name, seed]
                log.write(text)
                outcomes.append(data.get("outcome", f"exit {code}"))
                runs += data.get("scenarios_run", 0)
                used = max([used, *data.get("tolerance_used", {}).values()])
            alarms += sum(o != "clean" for o in outcomes)
            scenarios += runs
            rows.append([name, ", ".join(f"seed {s}: {o}" for s, o in zip(seeds, outcomes)), f"{runs:,}",
                         f"{used:.2f}"])
    summary = {"name": "hunt_user_checkpoints", "command": command, "notebook": "notebooks/06_catching_defects.ipynb",
               "checkpoints": len(rows), "seeds": list(seeds), "budget_s": budget, "false_alarms": alarms,
               "scenarios": scenarios, "quantities": {},
               "tables": {"sweep": {
                   "caption": f"The fixed engine hunted on checkpoints saved by transformers (`minikv hunt --model "
                              f"DIR --budget {budget:g} --seed S`, S = {', '.join(map(str, seeds))}): {alarms} false "
                              f"alarm(s) in {len(rows) * len(seeds)} hunts, {scenarios:,} scenarios",
                   "columns": ["checkpoint", "outcome", "scenarios", "largest share of a tolerance"],
                   "rows": rows}}}
    (out / "hunt_user_checkpoints.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--only", nargs="*", choices=tuple(CHECKPOINTS), default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="then hunt each, seeds 0 to 2, into results/")
    p.add_argument("--budget", type=float, default=60.0)
    p.add_argument("--jobs", type=int, default=1, help="hunts at a time in --sweep (each on one thread)")
    args = p.parse_args(argv)
    names = args.only or list(CHECKPOINTS)
    for name in names:
        print(write(name, Path(args.dir) / name, args.seed))
    if args.sweep:
        command = ("python tools/user_checkpoints.py DIR --sweep" + (f" --budget {args.budget:g}" if args.budget != 60
                                                                      else "") + (f" --jobs {args.jobs}"
                                                                                  if args.jobs != 1 else ""))
        summary = sweep(Path(args.dir), names, budget=args.budget, command=command, jobs=args.jobs)
        print(f"{summary['false_alarms']} false alarm(s) over {summary['checkpoints']} checkpoints x "
              f"{len(summary['seeds'])} seeds, {summary['scenarios']:,} scenarios")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
