"""What one engine step did: `StepOutput`, returned by `LLM.step()`, and its `StepTrace` of cache events.
See docs/internals.md#engine-step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minikv.attention.trace import CacheEvent, ScaleFill
    from minikv.engine.outputs import RequestOutput

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class StepTrace:
    """Cache events of one step, in execution order."""

    events: tuple[CacheEvent, ...]
    scale_fills: tuple[ScaleFill, ...]
    guard_check: str
    cuda_graph: str = "eager"
    graph_batch: int = 0

    def pools_written(self) -> tuple[str, ...]:
        """The pools some layer wrote this step, in first-written order."""
        return tuple(dict.fromkeys(e.pool for e in self.events if e.wrote))


@dataclass(frozen=True)
class StepOutput:
    """What one `LLM.step()` did."""

    step: int
    phase: str
    request_ids: tuple[int, ...]
    sampled: dict[int, int]
    num_cached_tokens: dict[int, int]
    seq_lens: dict[int, int]
    finished: tuple[RequestOutput, ...]
    block_tables: dict[int, tuple[int, ...]]
    slot_mapping: dict[int, tuple[int, ...]]
    cross_block_tables: dict[int, tuple[int, ...]]
    cross_slot_mapping: dict[int, tuple[int, ...]]
    trace: StepTrace

    def block_slots(self, request_id: int, block_size: int) -> list[int]:
        """The cache slots of all `seq_lens[request_id]` tokens of a request, prefix-cache hits included."""
        from minikv.cache.blocks import slot_of
        table = self.block_tables[request_id]
        return [slot_of(table, p, block_size) for p in range(self.seq_lens[request_id])]

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"
