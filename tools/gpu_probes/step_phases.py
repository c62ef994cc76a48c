"""Host time of each phase of a graph-replayed engine decode step, without a profiler (CUDA machine).

    FORMATS="auto int8_per_token_head" python tools/gpu_probes/step_phases.py [CONTEXT ...]

The engine of `minikv.bench engine` (each cache format of FORMATS, default auto; batch 64) decodes 24 tokens per
prompt; the engine's own methods are wrapped with perf_counter (schedule, padding the batch, loading the static
buffers, the graph's launch, the snapshot, sampling, which waits for the device, and postprocess); per phase, the
median over the steady steps, beside the graph's replay alone and its device time inside the steps (CUDA events
around the launch). Then the same with the garbage collector frozen after warm-up (gc.freeze).
"""
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import torch

BATCH = 64


def timed(owner, name, into):
    fn = getattr(owner, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            into[name].append(1e3 * (time.perf_counter() - t))
    setattr(owner, name, wrapper)


def run(path, context: int, freeze: bool, fmt: str = "auto") -> None:
    import minikv
    import minikv.engine.cuda_graph as cg
    from minikv.bench.engine import PREFILL_TOKENS_PER_STEP, _replay_ms, cache_args
    llm = minikv.LLM(model=path, **cache_args(fmt), device="cuda", dtype=torch.bfloat16, max_num_seqs=BATCH,
                     max_num_batched_tokens=PREFILL_TOKENS_PER_STEP, sanitize=False)
    rng = random.Random(0)
    prompts = ["".join(rng.choice("0123456789 ") for _ in range(context)) for _ in range(BATCH)]
    llm.generate(prompts[:max(1, PREFILL_TOKENS_PER_STEP // context)],
                 minikv.SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    for p in prompts:
        llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    while llm.step().phase == "prefill":      # the prefills, then the capturing step
        pass
    if freeze:
        gc.collect()
        gc.freeze()
    phases = defaultdict(list)
    timed(llm.scheduler, "schedule", phases)
    timed(llm.scheduler, "postprocess", phases)
    timed(llm, "_snapshot", phases)
    timed(llm.runner, "sample", phases)
    timed(cg, "pad_decode_batch", phases)
    graphs = llm.runner.graphs
    timed(graphs, "_load", phases)
    timed(graphs.seam, "replay", phases)
    launch, device = graphs.seam.replay, []           # the replay's device time: CUDA events around its launch

    def replay_on_device(graph):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch(graph)
        end.record()
        device.append((start, end))
    graphs.seam.replay = replay_on_device
    walls = []
    for _ in range(20):
        t = time.perf_counter()
        llm.step()
        walls.append(1e3 * (time.perf_counter() - t))
    torch.cuda.synchronize()
    on_device = statistics.median(a.elapsed_time(b) for a, b in device[2:])
    replay = _replay_ms(llm, BATCH)
    med = {k: statistics.median(v[2:]) for k, v in phases.items()}
    print(f"{fmt} context {context}{' (gc frozen)' if freeze else ''}: step median "
          f"{statistics.median(walls[2:]):.3f} ms (min {min(walls[2:]):.3f}), graph replay alone {replay:.3f} ms, "
          f"on the device in the steps {on_device:.3f}; phases (median ms): "
          + ", ".join(f"{k} {v:.3f}" for k, v in med.items())
          + f"; not in a phase {statistics.median(walls[2:]) - sum(med.values()):.3f}")
    print(f"   steps: {' '.join(f'{w:.2f}' for w in walls)}")
    if freeze:
        gc.unfreeze()
    while llm.has_unfinished():
        llm.step()
    del llm
    torch.cuda.empty_cache()


if __name__ == "__main__":
    from minikv.bench.engine import e2b_like_checkpoint
    contexts = [int(a) for a in sys.argv[1:]] or [2048, 8192]
    path = tempfile.mkdtemp()
    e2b_like_checkpoint(path, max_position_embeddings=max(4096, max(contexts) + 64))
    for c in contexts:
        for fmt in os.environ.get("FORMATS", "auto").split():
            for freeze in (False, True):
                run(path, c, freeze, fmt)
