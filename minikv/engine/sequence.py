"""Requests as the engine sees them: the running sequence (SamplingParams and the outputs live beside it).
See docs/internals.md#engine-sequence."""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from minikv.engine.sampling_params import SamplingParams
from minikv.kernels.errors import InvalidValueError

if TYPE_CHECKING:  # torch is imported only when a seeded generator is actually needed
    import torch

FINISH_REASONS = ("length", "stop", "eos", "abort")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request in flight. Sampling draws from its own seeded CPU `generator` (`sampling.seed` plus `index`, or
    one derived from the engine's seed and `request_id`), so its tokens do not depend on its batch."""

    def __init__(self, request_id: int, prompt: str | None, prompt_token_ids: list[int],
                 sampling: SamplingParams | None = None, encoder_token_ids: list[int] | None = None,
                 default_seed: int = 0, index: int = 0, parent_id: int | None = None):
        if len(prompt_token_ids) == 0:
            raise InvalidValueError(f"request {request_id}: the prompt has no tokens; at least one is needed")
        if encoder_token_ids is not None and len(encoder_token_ids) == 0:
            raise InvalidValueError(f"request {request_id}: encoder_token_ids is empty (None for a decoder-only model)")
        self.request_id = request_id
        # Completion `index` of the request `parent_id` (SamplingParams.n > 1 runs one sequence per completion).
        self.index = index
        self.parent_id = request_id if parent_id is None else parent_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.sampling = sampling if sampling is not None else SamplingParams()
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self._table_of, self._table = None, ()         # the list table_snapshot last copied, and its tuple
        self.num_cached_tokens = 0
        self.encoder_token_ids = None if encoder_token_ids is None else list(encoder_token_ids)
        self.cross_block_table: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None     # the stop token id or stop string that ended it
        # With SamplingParams(logprobs=k): per generated token, {token id: (logprob, rank)}; and their sum.
        self.logprobs: list[dict[int, tuple[float, int]]] = []
        self.cumulative_logprob = 0.0
        self.generator: torch.Generator | None = None
        if self.sampling.temperature > 0:
            import torch
            seed = self.sampling.seed
            seed = (default_seed * 1_000_003 + request_id) % (1 << 63) if seed is None else seed + index
            self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def __len__(self) -> int:
        return len(self.token_ids)

    def __repr__(self) -> str:
        return (f"Sequence(request_id={self.request_id}, status={self.status.name}, len={len(self)}, "
                f"outputs={self.num_output_tokens}, blocks={self.block_table}, cached={self.num_cached_tokens})")

    def table_snapshot(self) -> tuple[int, ...]:
        """`block_table` as a tuple, shared by the steps' outputs until the table grows or is replaced."""
        if self._table_of is not self.block_table or len(self._table) != len(self.block_table):
            self._table_of, self._table = self.block_table, tuple(self.block_table)
        return self._table

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens (without the prompt)."""
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def append_token(self, token_id: int, logprobs: dict[int, tuple[float, int]] | None = None) -> None:
        self.token_ids.append(int(token_id))
        if logprobs is not None:
            self.logprobs.append(logprobs)
            self.cumulative_logprob += logprobs[int(token_id)][0]
