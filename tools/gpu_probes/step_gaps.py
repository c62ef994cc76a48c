"""Where a graph-replayed engine decode step spends the time its replay alone does not (CUDA machine).

    python tools/gpu_probes/step_gaps.py OUT_DIR [CONTEXT ...]

For each context: the engine of `minikv.bench engine` (auto format, batch 64, graphs on) decodes; torch.profiler
records three steady steps, then three back-to-back replays of the same graph. Per step it prints the wall time,
when the first kernel started after the step began (host work before the launch), the kernels' summed and spanned
time, and how long the step ran after its last kernel (the sync and the host work after it); the same for the
replays; and the CUDA runtime calls of the steps. Chrome traces: OUT_DIR/trace_CONTEXT.json.gz.
"""
import collections
import gzip
import json
import os
import random
import sys
import tempfile
import time

import torch

BATCH = 64


def kernels_in(events, t0, t1):
    return sorted((e for e in events if e.get("cat") == "kernel" and t0 <= e["ts"] < t1), key=lambda e: e["ts"])


def summary(kernels, t0, t1) -> str:
    busy, end = 0.0, None
    for k in kernels:                    # the union of the kernels' intervals
        s, e = k["ts"], k["ts"] + k["dur"]
        if end is None or s >= end:
            busy, end = busy + k["dur"], e
        elif e > end:
            busy, end = busy + e - end, e
    first = kernels[0]["ts"] - t0 if kernels else float("nan")
    last = kernels[-1]["ts"] + kernels[-1]["dur"] if kernels else t0
    return (f"wall {(t1 - t0) / 1e3:6.3f} ms | first kernel at +{first / 1e3:.3f} ms | {len(kernels)} kernels, "
            f"sum {sum(k['dur'] for k in kernels) / 1e3:6.3f} ms, busy {busy / 1e3:6.3f} ms, span "
            f"{(last - (kernels[0]['ts'] if kernels else t0)) / 1e3:6.3f} ms | after last kernel {(t1 - last) / 1e3:.3f} ms")


def run(out_dir: str, context: int) -> None:
    import minikv
    from minikv.bench.engine import PREFILL_TOKENS_PER_STEP, e2b_like_checkpoint
    from torch.profiler import ProfilerActivity, profile, record_function
    path = tempfile.mkdtemp()
    e2b_like_checkpoint(path, max_position_embeddings=max(4096, context + 64))
    llm = minikv.LLM(model=path, device="cuda", dtype=torch.bfloat16, max_num_seqs=BATCH,
                     max_num_batched_tokens=PREFILL_TOKENS_PER_STEP, sanitize=False)
    rng = random.Random(0)
    prompts = ["".join(rng.choice("0123456789 ") for _ in range(context)) for _ in range(BATCH)]
    per_step = max(1, PREFILL_TOKENS_PER_STEP // context)
    llm.generate(prompts[:per_step], minikv.SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    for p in prompts:
        llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    walls = []
    while True:                                          # prefill, the capturing step, a few steady steps
        t = time.perf_counter()
        out = llm.step()
        if out.phase == "decode" and out.trace.cuda_graph == "replayed":
            walls.append(1e3 * (time.perf_counter() - t))
            if len(walls) == 6:
                break
    print(f"context {context}: steady steps before profiling (ms): {' '.join(f'{w:.2f}' for w in walls)}")
    graph = llm.runner.graphs.captured[BATCH].graph
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            with record_function(f"step {i}"):
                llm.step()
        torch.cuda.synchronize()
        for i in range(3):
            with record_function(f"replay {i}"):
                graph.replay()
        torch.cuda.synchronize()
    trace = os.path.join(out_dir, f"trace_{context}.json")
    prof.export_chrome_trace(trace)
    events = json.load(open(trace))["traceEvents"]
    with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:
        dst.write(src.read())
    os.remove(trace)
    marks = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(("step", "replay"))),
                   key=lambda e: e["ts"])
    steps = [m for m in marks if m["name"].startswith("step")]
    for m in steps:
        print(f"  {m['name']:9s} {summary(kernels_in(events, m['ts'], m['ts'] + m['dur']), m['ts'], m['ts'] + m['dur'])}")
    replays = [m for m in marks if m["name"].startswith("replay")]
    gpu_marks = sorted((e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("replay")),
                       key=lambda e: e["ts"])
    for m in gpu_marks or replays:       # back to back: a replay's kernels run after its host call returned
        ks = kernels_in(events, m["ts"], m["ts"] + m["dur"])
        print(f"  {m['name']:9s} (device range) {summary(ks, m['ts'], m['ts'] + m['dur'])}")
    if not gpu_marks and replays:
        t0 = replays[0]["ts"]
        ks = [k for k in kernels_in(events, t0, float("inf"))]
        print(f"  3 replays, all kernels after the first launch: {summary(ks, t0, ks[-1]['ts'] + ks[-1]['dur'])}")
    runtime = collections.defaultdict(lambda: [0, 0.0])
    for m in steps:
        for e in events:
            if e.get("cat") == "cuda_runtime" and m["ts"] <= e["ts"] < m["ts"] + m["dur"]:
                runtime[e["name"]][0] += 1
                runtime[e["name"]][1] += e["dur"]
    print("  CUDA runtime calls in the 3 steps (count, ms per step):")
    for name, (n, dur) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:10]:
        print(f"    {name:40s} {n / 3:6.1f} {dur / 3e3:7.3f}")
    cpu = collections.defaultdict(float)
    for m in steps:
        for e in events:
            if e.get("cat") == "python_function" or e.get("cat") == "cpu_op":
                if m["ts"] <= e["ts"] < m["ts"] + m["dur"]:
                    cpu[e["name"]] += e["dur"]
    print("  CPU ops in the 3 steps (ms per step, inclusive):")
    for name, dur in sorted(cpu.items(), key=lambda kv: -kv[1])[:12]:
        print(f"    {name[:60]:60s} {dur / 3e3:7.3f}")
    del llm
    torch.cuda.empty_cache()


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for c in [int(a) for a in sys.argv[2:]] or [2048, 8192]:
        run(out, c)
