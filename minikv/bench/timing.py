"""The one timing helper of the benchmarks: median milliseconds per call, on the CPU or on a GPU.
See docs/internals.md#bench-timing."""
from __future__ import annotations

import math

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch


class Timing(NamedTuple):
    ms: float
    how: str


def _capture(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream), or None if it cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph
    except Exception:           # noqa: BLE001 - fall back to eager timing, and say so in `how`
        torch.cuda.synchronize()
        return None


def time_ms(fn: Callable[[], object], device: str = "cuda", *, reps: int = 20, graph: bool = False) -> Timing:
    """Median time of one call of `fn` over `reps` runs."""
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    if torch.device(device).type != "cuda":
        fn()
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return Timing(statistics.median(samples), "wall clock")
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    captured = _capture(fn) if graph else None
    run = captured.replay if captured is not None else fn
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return Timing(statistics.median(times), "cuda graph" if captured is not None else "eager")


def format_ratio(value: float) -> str:
    """A ratio to three decimals, rounded down (toward the target it is compared with from below), so a printed
    ratio reaches its target only when the measured one does: never "MISSED 0.700x (target 0.70x)"."""
    return f"{math.floor(value * 1000) / 1000:.3f}x"
