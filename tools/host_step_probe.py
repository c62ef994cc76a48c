"""The host's share of a graph-replayed decode step, measured on a CPU: the engine's own step with the graph's replay
taken out.

    python tools/host_step_probe.py [BATCH] [ROUNDS]

tiny-gemma4, `BATCH` prompts (default 64) decoding together, CUDA graphs switched on with a capture seam that runs
the decode forward once and makes each replay a no-op. What a step then costs is the host work a GPU step adds to
its replay (scheduling, padding the batch, loading the static buffers, the snapshot, sampling, postprocess), minus
the CUDA API calls. Prints the median step in µs over ROUNDS (default 5) rounds of 60 steps. Run it under two
trees (PYTHONPATH) to compare them on one machine; tools/gpu_probes/step_phases.py is its counterpart on a GPU.
"""
import statistics
import sys
import time

import minikv
from minikv.config import EngineConfig
from minikv.engine import cuda_graph


class ReplayNothing:
    """Capture runs the forward once (its logits become the graph's outputs); replay does nothing."""

    @staticmethod
    def capture(fn):
        return None, fn()

    @staticmethod
    def warm_up(fn):
        return fn()

    @staticmethod
    def replay(graph) -> None:
        pass


def median_step_us(batch: int, steps: int = 60) -> float:
    EngineConfig.cuda_graphs = property(lambda self: True)
    cuda_graph.CudaGraphCapture = ReplayNothing
    llm = minikv.LLM(model="tiny-gemma4", max_num_seqs=batch, max_num_batched_tokens=batch * 32, sanitize=False,
                     seed=0)
    for i in range(batch):                    # arithmetic prompts of 10 numbers (this model's task), 27-39 tokens
        llm.add_request(" ".join(str(i + k) for k in range(10)),
                        minikv.SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True))
    walls = []
    while llm.has_unfinished() and len(walls) < steps:
        t = time.perf_counter()
        out = llm.step()
        if out.trace.cuda_graph == "replayed" and len(out.sampled) == batch:
            walls.append(time.perf_counter() - t)
    if len(walls) < steps // 2:
        raise RuntimeError(f"only {len(walls)} replayed steps of the whole batch")
    return 1e6 * statistics.median(walls)


if __name__ == "__main__":
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    figures = [median_step_us(batch) for _ in range(rounds)]
    print(f"minikv from {minikv.__file__}: batch {batch}, median host step per round (µs): "
          + " ".join(f"{f:.0f}" for f in figures) + f"; median {statistics.median(figures):.0f}")
