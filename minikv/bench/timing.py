"""The one timing helper of the benchmarks: median milliseconds per call, on the CPU or on a GPU.
See docs/internals.md#bench-timing."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch


NOISY = 0.10
REMEASURES = 3


@dataclass(frozen=True)
class Timing:
    """A median time and how it was taken, with the spread of its repeats (`ms, how = timing` unpacks the two)."""

    ms: float
    how: str
    min_ms: float = math.nan
    max_ms: float = math.nan
    remeasured: int = 0        # how many times it was taken again because its spread exceeded NOISY

    def __iter__(self):
        return iter((self.ms, self.how))

    @property
    def noisy(self) -> bool:
        return self.max_ms > (1 + NOISY) * self.min_ms

    def columns(self, prefix: str = "") -> dict:
        """A CSV row's spread columns: {prefix}min_ms, {prefix}max_ms, {prefix}remeasured, {prefix}noisy."""
        return {f"{prefix}min_ms": self.min_ms, f"{prefix}max_ms": self.max_ms,
                f"{prefix}remeasured": self.remeasured, f"{prefix}noisy": self.noisy}


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
        return Timing(statistics.median(samples), "wall clock", min(samples), max(samples))
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    captured = _capture(fn) if graph else None
    run = captured.replay if captured is not None else fn
    best = None
    for attempt in range(1 + REMEASURES):
        times = []
        for _ in range(reps):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        timing = Timing(statistics.median(times), "cuda graph" if captured is not None else "eager", min(times),
                        max(times), attempt)
        if best is None or timing.max_ms / timing.min_ms < best.max_ms / best.min_ms:
            best = timing
        if not timing.noisy:
            break
    return replace(best, remeasured=attempt)


def format_ratio(value: float) -> str:
    """A ratio to three decimals, rounded down (toward the target it is compared with from below), so a printed
    ratio reaches its target only when the measured one does: never "MISSED 0.700x (target 0.70x)"."""
    return f"{math.floor(value * 1000) / 1000:.3f}x"


def ceilings(gib: float = 4.0) -> dict[str, float]:
    """The GPU's memory ceilings, measured now on `gib` GiB: a device-to-device copy (bytes read and written) and a
    read-only pass (a sum), in GB/s. Eager: a captured copy becomes a copy-engine node, slower than the copy kernel
    torch launches eagerly; at this size the launch overhead is nothing anyway."""
    n = int(gib * 2**30) // 4
    a = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    copy_ms = time_ms(lambda: b.copy_(a), "cuda", graph=False).ms
    read_ms = time_ms(lambda: a.sum(), "cuda", graph=False).ms
    nbytes = a.numel() * 4
    return {"copy_GBps": 2 * nbytes / copy_ms / 1e6, "read_GBps": nbytes / read_ms / 1e6}
