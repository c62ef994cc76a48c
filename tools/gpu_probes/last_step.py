"""Where the host time of the engine bench's decode steps goes, the last step included (CUDA machine):

    python tools/gpu_probes/last_step.py CONTEXT FORMAT [FORMAT ...]

Runs `minikv.bench.engine.gpu_decode_speed` (batch 64, 16 new tokens) with the engine's methods wrapped by
perf_counter at class level (schedule, forward, snapshot, sample, postprocess, free_blocks, the request outputs)
and Python's garbage collections timed through gc.callbacks. Prints, per format, every decode step after the graph
capture: its wall time, each phase, and the collections inside it. The last step is the one that finishes all 64
requests and frees their blocks. Works on any tree that has these methods (run it with PYTHONPATH at another tree).
"""
import gc
import statistics
import sys
import tempfile
import time
from collections import defaultdict

WRAPPED = {"minikv.engine.scheduler:Scheduler": ("schedule", "postprocess"),
           "minikv.engine.model_runner:ModelRunner": ("forward", "sample"),
           "minikv.engine.llm:LLM": ("_snapshot", "_output"),
           "minikv.cache.blocks:BlockManager": ("free_blocks",)}
steps: list[dict] = []          # one per LLM.step: phase -> ms, "gc" -> [(generation, ms)], "wall", "phase"


def _wrap(cls, name, record):
    fn = getattr(cls, name)
    static = isinstance(cls.__dict__.get(name), staticmethod)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            if steps:
                steps[-1][record] += 1e3 * (time.perf_counter() - t)
    setattr(cls, name, staticmethod(wrapper) if static else wrapper)


def _gc_callback(phase, info):
    if phase == "start":
        _gc_callback.t = time.perf_counter()
    elif steps:
        steps[-1]["gc"].append((info["generation"], 1e3 * (time.perf_counter() - _gc_callback.t)))


def instrument():
    import importlib

    import minikv.engine.llm as llm_module
    for where, names in WRAPPED.items():
        module, cls = where.split(":")
        for name in names:
            _wrap(getattr(importlib.import_module(module), cls), name, name.strip("_"))
    step = llm_module.LLM.step

    def timed_step(self, *a, **k):
        steps.append(defaultdict(float, gc=[]))
        t = time.perf_counter()
        out = step(self, *a, **k)
        steps[-1].update(wall=1e3 * (time.perf_counter() - t), phase=out.phase, graph=out.trace.cuda_graph,
                         finished=len(out.finished))
        return out
    llm_module.LLM.step = timed_step
    gc.callbacks.append(_gc_callback)


def main(context: int, formats: list[str]) -> None:
    import torch

    import minikv
    from minikv.bench.engine import e2b_like_checkpoint, gpu_decode_speed
    print("minikv from", minikv.__file__, "|", torch.cuda.get_device_name(), "| python", sys.version.split()[0])
    print("tracked objects after import:", len(gc.get_objects()), "| gc thresholds", gc.get_threshold())
    instrument()
    phases = ["schedule", "forward", "snapshot", "sample", "postprocess", "free_blocks", "output"]
    with tempfile.TemporaryDirectory() as path:
        e2b_like_checkpoint(path, max_position_embeddings=max(4096, context + 64))
        for fmt in formats:
            steps.clear()
            row = gpu_decode_speed(path, fmt, 64, context, 16)
            last_prefill = max(i for i, s in enumerate(steps) if s.get("phase") == "prefill")
            decode = [s for s in steps[last_prefill + 1:] if s.get("graph") != "captured"]
            print(f"\n{fmt}, batch 64, context {context}: {row['decode_ms_per_step']:.2f} ms per step (mean), median "
                  f"{row['step_ms']:.2f}; tracked objects now {len(gc.get_objects())}")
            print("step  wall_ms  " + "  ".join(f"{p:>11s}" for p in phases) + "  gc (generation: ms)")
            for i, s in enumerate(decode):
                gcs = " ".join(f"{g}:{ms:.1f}" for g, ms in s["gc"])
                print(f"{i:>4d} {s['wall']:8.2f}  " + "  ".join(f"{s[p]:11.2f}" for p in phases)
                      + f"  {gcs}{'  <- finishes all' if s.get('finished') == 64 else ''}")
            steady = decode[:-1]
            if steady:
                print("median of the steps before the last: " + ", ".join(
                    f"{p} {statistics.median(s[p] for s in steady):.2f}" for p in ["wall", *phases]))
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(int(sys.argv[1]), sys.argv[2:])
