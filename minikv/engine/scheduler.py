"""The scheduler: continuous batching over a waiting and a running queue.
See docs/internals.md#engine-scheduler."""
from __future__ import annotations

from collections import deque

from minikv.cache.blocks import BlockManager
from minikv.engine.sequence import FINISH_REASONS, Sequence, SequenceStatus
from minikv.kernels.errors import InvalidValueError


class Scheduler:
    """Decides which sequences run in the next step and keeps the block managers in step with them."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, block_manager: BlockManager,
                 cross_block_manager: BlockManager | None = None, eos_token_id: int | None = None):
        if cross_block_manager is not None and cross_block_manager.enable_prefix_caching:
            raise InvalidValueError("the cross pool's block manager must not use prefix caching")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_manager = block_manager
        self.cross_block_manager = cross_block_manager
        self.eos_token_id = eos_token_id
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()
        self._unfinished: dict[int, Sequence] = {}
        self.num_preemptions = 0

    def blocks_needed(self, seq: Sequence) -> int:
        """The most blocks `seq` can ever hold: K/V are written for every token but the last generated one."""
        max_kv_tokens = seq.num_prompt_tokens + seq.sampling.max_tokens - 1
        return self.block_manager.blocks_for_tokens(max_kv_tokens)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence. Raises ValueError for a sequence that could never run, instead of hanging."""
        if seq.status is not SequenceStatus.WAITING or seq.block_table or seq.num_output_tokens:
            raise InvalidValueError(f"request {seq.request_id} is not a fresh sequence ({seq!r})")
        if seq.request_id in self._unfinished:
            raise InvalidValueError(f"request id {seq.request_id} is already queued or running")
        self.check_admissible(seq)
        self.waiting.append(seq)
        self._unfinished[seq.request_id] = seq

    def check_admissible(self, seq: Sequence, name: str | None = None) -> None:
        """Raise ValueError when `seq` could never run with these pools and budgets."""
        name = name or f"request {seq.request_id}"
        needed = self.blocks_needed(seq)
        pool = self.block_manager.num_blocks
        if needed > pool:
            raise InvalidValueError(f"{name} can never fit: {seq.num_prompt_tokens} prompt tokens + max_tokens "
                                    f"{seq.sampling.max_tokens} need {needed} blocks of "
                                    f"{self.block_manager.block_size} tokens, but the KV pool holds only {pool} blocks")
        # A preempted sequence is prefilled again with everything it generated, so that must fit one step.
        max_prefill = seq.num_prompt_tokens + seq.sampling.max_tokens - 1
        if max_prefill > self.max_num_batched_tokens:
            raise InvalidValueError(f"{name} can never fit: {seq.num_prompt_tokens} prompt tokens + max_tokens "
                                    f"{seq.sampling.max_tokens} may need a prefill of {max_prefill} tokens (after "
                                    f"preemption), but max_num_batched_tokens is {self.max_num_batched_tokens}")
        if (seq.encoder_token_ids is None) != (self.cross_block_manager is None):
            kind = "has" if seq.encoder_token_ids is not None else "has no"
            pool_kind = "no" if self.cross_block_manager is None else "a"
            raise InvalidValueError(f"{name} {kind} encoder tokens, but this scheduler has {pool_kind} cross pool")
        if self.cross_block_manager is not None:
            cross_needed = self.cross_block_manager.blocks_for_tokens(len(seq.encoder_token_ids))
            cross_pool = self.cross_block_manager.num_blocks
            if cross_needed > cross_pool:
                raise InvalidValueError(f"{name} can never fit: {len(seq.encoder_token_ids)} encoder tokens "
                                        f"need {cross_needed} cross blocks, but the cross pool holds only "
                                        f"{cross_pool} blocks")

    def schedule(self) -> tuple[list[Sequence], bool]:
        """The sequences of the next step and whether it is a prefill. `([], False)` when nothing is left."""
        if not self._unfinished:
            return [], False
        batch = self._schedule_prefill()
        if batch:
            return batch, True
        batch = self._schedule_decode()
        if batch:
            return batch, False
        # Every running sequence was preempted; they are waiting now, with the whole pool free.
        batch = self._schedule_prefill()
        if batch:
            return batch, True
        raise RuntimeError(f"scheduler stuck: waiting={list(self.waiting)}, running={list(self.running)}")

    def _schedule_prefill(self) -> list[Sequence]:
        batch: list[Sequence] = []
        num_tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq):
                break
            cross = self.cross_block_manager
            if cross is not None and not cross.can_allocate_tokens(len(seq.encoder_token_ids)):
                break
            # The budget counts prefix hits too (known only after allocating); add() made sure one sequence fits.
            if num_tokens + len(seq) > self.max_num_batched_tokens:
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq)
            if self.cross_block_manager is not None:
                seq.cross_block_table = self.cross_block_manager.allocate_tokens(len(seq.encoder_token_ids))
            num_tokens += len(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.append(seq)
        return batch

    def _schedule_decode(self) -> list[Sequence]:
        batch: list[Sequence] = []
        while self.running:
            seq = self.running.popleft()
            while not self.block_manager.can_append(seq):
                if self.running:
                    self._preempt(self.running.pop())
                else:
                    self._preempt(seq)
                    break
            else:
                self.block_manager.may_append(seq)
                batch.append(seq)
        self.running.extend(batch)
        return batch

    def _preempt(self, seq: Sequence) -> None:
        self._free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def postprocess(self, seqs: list[Sequence], token_ids: list[int], logprobs: list | None = None) -> None:
        """Record one sampled token per sequence of the step (and its logprobs entry), and finish those that are
        done: EOS and `stop_token_ids` are not appended; `max_tokens` reached finishes with "length"."""
        if len(seqs) != len(token_ids):
            raise InvalidValueError(f"postprocess got {len(seqs)} sequences but {len(token_ids)} tokens")
        running, eos = SequenceStatus.RUNNING, self.eos_token_id          # looked up once: this loop is per token
        for i, (seq, token_id) in enumerate(zip(seqs, token_ids)):
            if seq.status is not running:
                raise RuntimeError(f"request {seq.request_id} is {seq.status.name}, not RUNNING")
            p = seq.sampling
            if token_id == eos and not p.ignore_eos:
                self.finish(seq, "eos")
                continue
            if p.stop_token_ids and token_id in p.stop_token_ids:
                seq.stop_reason = int(token_id)
                self.finish(seq, "stop")
                continue
            seq.append_token(token_id, None if logprobs is None else logprobs[i])
            if seq.num_output_tokens >= p.max_tokens:
                self.finish(seq, "length")

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence: free its blocks and cross blocks and take it out of the queues."""
        if reason not in FINISH_REASONS:
            raise InvalidValueError(f"unknown finish reason {reason!r}; use one of {', '.join(FINISH_REASONS)}")
        seq.finish_reason = reason
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self._free(seq)
        seq.status = SequenceStatus.FINISHED
        self._unfinished.pop(seq.request_id, None)

    def abort(self, request_id: int) -> Sequence | None:
        """Finish a waiting or running request with reason "abort". Returns it, or None if not in flight."""
        seq = self._unfinished.get(request_id)
        if seq is not None:
            self.finish(seq, "abort")
        return seq

    def has_unfinished(self) -> bool:
        return bool(self._unfinished)

    def _free(self, seq: Sequence) -> None:
        self.block_manager.deallocate(seq)
        if self.cross_block_manager is not None and seq.cross_block_table:
            self.cross_block_manager.free_blocks(seq.cross_block_table)
        seq.cross_block_table = []
