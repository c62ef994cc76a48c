"""`python -m minikv.bench engine`: end-to-end generation speed through the engine.

On a CPU (the default): tiny-gemma4 (or `--model`), 48 prompts x 12 new tokens at max_num_seqs=8 (the figures the
README quotes), greedy, per backend. Through the Triton interpreter this measures the interpreter, not the kernels'
design; the process's CPU time is printed beside the wall time: on a shared, busy machine it is the better
estimate of what an idle one takes (set OMP_NUM_THREADS=1 so that the two measure the same work).

On a GPU (`--device cuda`): decode tokens/s per KV-cache format of a model at gemma-4-E2B's dimensions with random
weights (35 layers of hidden 1536, MLP 6144, 8 query heads over 1 KV head of 256 on sliding layers and 512 on
full ones, 4 sliding : 1 full, window 512, the last 20 layers sharing KV; a 100-character vocabulary instead of
262,144), bfloat16, batch 64, every prompt `--context` tokens long. The engine runs as it always does (step by
step, no CUDA graphs; the arena's canary check after each step off, as in production); decode tokens/s = tokens
sampled in decode steps / their wall time.
"""
from __future__ import annotations

import csv
import sys
import tempfile
import time

from minikv.kernels.formats import KV_CACHE_DTYPES


def measure(backend: str, device: str, kv_cache_dtype: str, prompts: int, max_tokens: int, max_num_seqs: int,
            model: str = "tiny-gemma4"):
    import minikv
    from minikv.evaluate import task_of
    task = task_of(model)
    ps = task.prompts(prompts, seed=0)
    llm = minikv.LLM(model=model, kv_cache_dtype=kv_cache_dtype, device=device, backend=backend,
                     max_num_seqs=max_num_seqs)
    start, cpu_start = time.perf_counter(), time.process_time()
    outs = llm.generate(ps, minikv.SamplingParams(max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = sum(len(o.token_ids) for o in outs)
    right = sum(task.check(p, o.text) for p, o in zip(ps, outs))
    return seconds, cpu_seconds, tokens, right


def e2b_like_checkpoint(path, device: str = "cuda", **overrides) -> None:
    """A random minikv Gemma-4 checkpoint at gemma-4-E2B's layer dimensions (or `overrides` of them), written to
    `path` in bfloat16."""
    import torch

    from minikv.models.dir_tokenizer import save_char_tokenizer
    from minikv.models.gemma4 import FULL, SLIDING, Gemma4Config, Gemma4ForCausalLM
    from minikv.models.hf_checkpoint import save_checkpoint
    from minikv.models.tokenizer import CharTokenizer
    vocab = CharTokenizer().vocab_size
    layer_types = [SLIDING, SLIDING, SLIDING, SLIDING, FULL] * 7
    config = {"model_type": "gemma4_text", "vocab_size": vocab, "hidden_size": 1536, "intermediate_size": 6144,
              "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
              "per_layer_config": {i: {"head_dim": 512, "num_key_value_heads": 1}
                                   for i, t in enumerate(layer_types) if t == FULL},
              "layer_types": layer_types, "sliding_window": 512, "num_kv_shared_layers": 20,
              "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": vocab,
              "final_logit_softcapping": 30.0, "max_position_embeddings": 4096, **overrides}
    torch.manual_seed(0)
    with torch.device(device):
        model = Gemma4ForCausalLM(Gemma4Config.from_hf_dict(config)).to(torch.bfloat16).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * (0.05 if p.dim() == 1 else 0.02) + (p.dim() == 1))
    save_checkpoint(model, path)
    save_char_tokenizer(CharTokenizer(), path)


def gpu_decode_speed(path, kv_cache_dtype: str, batch: int, context: int, new_tokens: int) -> dict:
    """Decode tokens/s of the engine on the checkpoint at `path`: `batch` prompts of `context` tokens."""
    import random

    import torch

    import minikv
    llm = minikv.LLM(model=str(path), kv_cache_dtype=kv_cache_dtype, device="cuda", dtype=torch.bfloat16,
                     max_num_seqs=batch, max_num_batched_tokens=8192, sanitize=False)   # no canary check per step
    rng = random.Random(0)
    prompts = ["".join(rng.choice("0123456789 ") for _ in range(context)) for _ in range(batch)]
    params = minikv.SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts[:2], minikv.SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)  # compile
    for p in prompts:
        llm.add_request(p, params)
    decode_seconds, decode_tokens, prefill_seconds = 0.0, 0, 0.0
    while llm.has_unfinished():
        start = time.perf_counter()
        out = llm.step()
        took = time.perf_counter() - start            # the sampled ids are on the host: the step is done
        if out.phase == "decode":
            decode_seconds += took
            decode_tokens += len(out.sampled)
        else:
            prefill_seconds += took
    return {"format": kv_cache_dtype, "batch": batch, "context": context, "new_tokens": new_tokens,
            "decode_tokens_per_s": decode_tokens / decode_seconds, "decode_ms_per_step":
            1e3 * decode_seconds / max(1, decode_tokens // batch), "prefill_s": prefill_seconds}


def gpu_rows(kv_cache_dtypes=KV_CACHE_DTYPES, batch: int = 64, context: int = 2048, new_tokens: int = 16,
             log=print) -> list[dict]:
    """Decode speed per format on a fresh E2B-like checkpoint; one dict per format (x_auto: speed over auto's)."""
    import torch
    log(f"gemma-4-E2B-like model (random weights, bf16), batch {batch}, prompts of {context} tokens, {new_tokens} "
        f"new tokens, {torch.cuda.get_device_name()}")
    rows = []
    with tempfile.TemporaryDirectory() as path:
        e2b_like_checkpoint(path)
        for fmt in kv_cache_dtypes:
            r = gpu_decode_speed(path, fmt, batch, context, new_tokens)
            rows.append(r)
            log(f"  {fmt:22s} {r['decode_tokens_per_s']:8.0f} decode tokens/s  ({r['decode_ms_per_step']:6.1f} ms per "
                f"decode step; prefill {r['prefill_s']:5.1f} s)")
            torch.cuda.empty_cache()
    base = rows[0]["decode_tokens_per_s"] if rows and rows[0]["format"] == "auto" else None
    if base:
        for r in rows:
            r["x_auto"] = r["decode_tokens_per_s"] / base
        log("  x auto (bf16): " + ", ".join(f"{r['format']} {r['x_auto']:.2f}" for r in rows))
    return rows


def gpu_main(args) -> int:
    rows = gpu_rows(args.kv_cache_dtypes, args.batch, args.context, args.new_tokens,
                    log=lambda line: print(line, flush=True))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {args.csv}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from minikv.argtypes import UsageParser, model_arg, positive_int
    from minikv.config import BACKENDS, KV_CACHE_DTYPES as FORMATS
    p = UsageParser(prog="minikv bench engine", description=__doc__)
    model_arg(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-cache-dtype", default="int8_per_token_head", choices=FORMATS, help="CPU: the cache format")
    p.add_argument("--prompts", type=positive_int, default=48, help="CPU: prompts")
    p.add_argument("--max-tokens", type=positive_int, default=12, help="CPU: new tokens per prompt")
    p.add_argument("--max-num-seqs", type=positive_int, default=8, help="CPU: batch")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS, help="CPU: backends")
    p.add_argument("--kv-cache-dtypes", nargs="+", default=list(KV_CACHE_DTYPES), choices=FORMATS,
                   help="GPU: the cache formats")
    p.add_argument("--batch", type=positive_int, default=64, help="GPU: sequences decoded together")
    p.add_argument("--context", type=positive_int, default=2048, help="GPU: prompt tokens per sequence")
    p.add_argument("--new-tokens", type=positive_int, default=16, help="GPU: tokens generated per sequence")
    p.add_argument("--csv", default=None, help="GPU: write the rows here")
    args = p.parse_args(argv)
    if args.device.startswith("cuda"):
        return gpu_main(args)
    print(f"{args.model}, {args.prompts} prompts x {args.max_tokens} new tokens, max_num_seqs={args.max_num_seqs}, "
          f"kv_cache_dtype={args.kv_cache_dtype}, device={args.device}")
    results = {}
    for backend in args.backends:
        seconds, cpu_seconds, tokens, right = measure(backend, args.device, args.kv_cache_dtype, args.prompts,
                                                      args.max_tokens, args.max_num_seqs, args.model)
        results[backend] = seconds
        cpu = f" ({cpu_seconds:.1f} s CPU)" if args.device == "cpu" else ""
        print(f"  {backend:7s} {seconds:7.1f} s{cpu}  {tokens / seconds:8.1f} tokens/s  ({right}/{args.prompts} right)")
    if "triton" in results and "torch" in results:
        print(f"  triton / torch time ratio: {results['triton'] / results['torch']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
