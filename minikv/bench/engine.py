"""`python -m minikv.bench engine`: end-to-end generation speed of tiny-gemma4 (or `--model`), per backend.

48 prompts x 12 new tokens at max_num_seqs=8 (the figures the README quotes), greedy, on the current device.
Through the Triton interpreter on a CPU this measures the interpreter, not the kernels' design. On a CPU the
process's CPU time is printed beside the wall time: on a shared, busy machine it is the better estimate of what
an idle one takes (set OMP_NUM_THREADS=1 so that the two measure the same work).
"""
from __future__ import annotations

import sys
import time


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


def main(argv: list[str] | None = None) -> int:
    from minikv.cli import UsageParser, model_arg, positive_int
    from minikv.config import BACKENDS, KV_CACHE_DTYPES
    p = UsageParser(prog="minikv bench engine", description=__doc__)
    model_arg(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-cache-dtype", default="int8_per_token_head", choices=KV_CACHE_DTYPES)
    p.add_argument("--prompts", type=positive_int, default=48)
    p.add_argument("--max-tokens", type=positive_int, default=12)
    p.add_argument("--max-num-seqs", type=positive_int, default=8)
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    args = p.parse_args(argv)
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
