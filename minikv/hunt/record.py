"""What a run of one scenario left behind, in engine-neutral terms: the records every oracle reads.
See docs/internals.md#hunt-record."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from .scenario import Scenario


@dataclass(frozen=True)
class KVRow:
    """The cache bytes of one token position in one pool: its codes (K then V, every KV head) and, for formats
    with inline scales, its scale bytes (same order)."""

    codes: bytes
    scales: bytes = b""


@dataclass
class RequestResult:
    index: int                           # the request's position in the scenario's request list
    wave: int                            # 0: the first submission; 1: the same request submitted again
    prompt: str
    max_tokens: int
    token_ids: tuple[int, ...]
    finish_reason: str | None
    # How it was scheduled: for every step it ran in, (phase, ((member index, cached tokens), ...)) with the
    # batch's members in batch order. Two copies with equal schedules ran the same computation.
    schedule: tuple = ()
    # Its KV bytes right after its prefill: pool name -> one KVRow per token position. None: not recorded.
    kv: dict[str, tuple[KVRow, ...]] | None = None
    # The logits the engine sampled each of its tokens from (float32 rows, one per token). None: not recorded.
    logits: tuple | None = None


@dataclass(frozen=True)
class StrayWrite:
    """Bytes a step changed outside every row its slot mapping names."""

    step: int
    region: str          # "pool NAME" or "guard after NAME" (the allocation the bytes belong to)
    offset: int          # first changed byte, relative to the region's start
    nbytes: int          # changed bytes in that region during that step


@dataclass
class Run:
    scenario: Scenario
    refused: str | None = None           # the engine refused the configuration or a request (ValueError/TypeError)
    error: str | None = None             # an accepted configuration raised: "ExceptionType: message"
    error_at: str = ""                   # where: "building the engine" or "step N"
    requests: list[RequestResult] = field(default_factory=list)
    stray_writes: list[StrayWrite] = field(default_factory=list)
    kernel_mismatches: list[str] = field(default_factory=list)   # kernel calls that disagreed with their reference
    steps: int = 0
    eos_id: int | None = None


class Engine(Protocol):
    """What the hunter drives: anything that runs a scenario and returns its Run."""

    def run(self, scenario: Scenario) -> Run: ...

    def snippet(self, scenario: Scenario) -> str:
        """Python that reproduces `scenario` on this engine (printed with a finding)."""
        ...
