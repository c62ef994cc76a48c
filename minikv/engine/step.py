"""What one engine step did: `StepOutput`, returned by `LLM.step()`, and its `StepTrace` of cache events.

See docs/internals.md#engine-step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minikv.attention.trace import CacheEvent, ScaleFill
    from minikv.engine.sequence import RequestOutput

PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class StepTrace:
    """Cache events of one step, in execution order.

    `events`: one `CacheEvent` per attention layer (which pool it wrote and/or read; cross attention's context
    path, and why). `scale_fills`: the scale-region fills (`ScaleFill`, from the engine's census) that happened
    during this step: a late fill with `overwritten > 0` is defect A at work. `guard_check`: "passed" when the
    arena's guard zones were checked after the step and found intact, "off" with `sanitize=False`; "failed"
    only in the `step_output` a KVCacheOverrunError carries (a damaged guard raises instead of returning a step).
    `cuda_graph`: "eager" (launched op by op: every prefill, and every step on CPU or with enforce_eager=True),
    "captured" (a decode step that ran eagerly and then captured its batch-size bucket's graph) or "replayed"
    (a decode step replayed from that graph, its events those of the captured step); `graph_batch`: the bucket's
    batch size (the step's sequences plus padding rows), 0 when eager (minikv.engine.cuda_graph).
    """

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
    """What one `LLM.step()` did.

    step             the engine's step counter (0 = its first real step; it keeps counting across sleep/wake_up);
    phase            "prefill" (each request brings its uncached prompt tokens) or "decode" (one token each);
    request_ids      the requests that ran, in batch order;
    sampled          request id -> the token id sampled for it in this step (an EOS is reported here too,
                     although it is not appended to the output);
    num_cached_tokens request id -> prompt tokens whose K/V came from the prefix cache (prefill steps);
    seq_lens         request id -> tokens whose K/V are in the cache after this step;
    finished         the requests that finished in this step, with their final RequestOutput;
    block_tables     request id -> its KV block table at this step (before finished requests freed blocks);
    slot_mapping     request id -> the cache slots this step wrote for it (-1 never appears here);
    cross_block_tables / cross_slot_mapping  the same for the cross pool (encoder-decoder models; empty
                     otherwise; cross slots are written at the prefill step only);
    trace            the per-layer cache events (StepTrace).
    """

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
