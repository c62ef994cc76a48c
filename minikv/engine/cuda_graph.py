"""CUDA-graph decode: the engine's decode forward captured once per batch-size bucket and replayed.
See docs/internals.md#engine-cuda-graph."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minikv.attention.context import ForwardContext
from minikv.attention.metadata import AttentionMetadata, CrossMetadata
from minikv.cache.blocks import slot_of


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The batch sizes graphs are captured for: 1, 2, 4, 8, then steps of 8, and max_num_seqs itself."""
    sizes = {b for b in (1, 2, 4, 8) if b < max_num_seqs} | set(range(16, max_num_seqs, 8)) | {max_num_seqs}
    return tuple(sorted(sizes))


def bucket_for(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding n sequences; None if none does (the step then runs eagerly)."""
    return next((b for b in buckets if b >= n), None)


@dataclass(frozen=True)
class DecodeBatch:
    """One decode step's inputs on the host, padded to `bucket` rows (numpy arrays)."""

    bucket: int
    num_real: int
    input_ids: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    encoder_lens: np.ndarray | None = None
    cross_block_tables: np.ndarray | None = None


_PADDING = object()           # HostBlockTables: a row that holds the padding table


class HostBlockTables:
    """Block tables on the host, int32 [rows, width], kept from one decode step to the next."""

    def __init__(self, rows: int, width: int, what: str):
        self.array = np.zeros((rows, width), dtype=np.int32)
        self.what = what
        self._lists: list = [None] * rows
        self._written = [0] * rows
        self.changed: tuple[int, int, int, int] | None = None

    def fill(self, tables, bucket: int, pad_block: int) -> np.ndarray:
        """The first `bucket` rows: `tables` (zeros past each end), then padding rows reading `pad_block`."""
        width = self.array.shape[1]
        rows, lo, hi = [], width, 0
        for i, table in enumerate(tables):
            n = len(table)
            if n > width:
                raise ValueError(f"a {self.what} of {n} blocks does not fit the graphs' {width}-block tables")
            start = self._written[i] if self._lists[i] is table and self._written[i] <= n else 0
            if start == 0:
                self.array[i, n:] = 0
                rows.append(i)
                lo, hi = 0, width
            if n > start:
                self.array[i, start:n] = table[start:]
                rows.append(i)
                lo, hi = min(lo, start), max(hi, n)
            self._lists[i], self._written[i] = table, n
        for i in range(len(tables), bucket):
            if self._lists[i] is not _PADDING or self.array[i, 0] != pad_block:
                self.array[i] = 0
                self.array[i, 0] = pad_block
                self._lists[i], self._written[i] = _PADDING, 0
                rows.append(i)
                lo, hi = 0, width
        self.changed = (min(rows), max(rows) + 1, lo, hi) if rows else None
        return self.array[:bucket]


def pad_decode_batch(seqs, bucket: int, width: int, block_size: int, dummy_block: int,
                     cross_width: int = 0, tables: HostBlockTables | None = None,
                     cross_tables: HostBlockTables | None = None) -> DecodeBatch:
    """The decode inputs of `seqs` padded to `bucket` rows that touch only a dummy block."""
    n = len(seqs)
    if n > bucket:
        raise ValueError(f"{n} sequences do not fit a bucket of {bucket}")
    # input ids, positions, slots, lengths; a padding row reads and writes only the dummy block
    ids, positions, slots, lens = np.array([[0], [0], [dummy_block * block_size], [1]], np.int64).repeat(bucket, 1)
    lens[:n] = [len(s.token_ids) for s in seqs]
    positions[:n] = lens[:n] - 1
    ids[:n] = [s.token_ids[-1] for s in seqs]
    slots[:n] = [slot_of(s.block_table, p, block_size) for s, p in zip(seqs, positions[:n].tolist())]
    tables = tables or HostBlockTables(bucket, width, "block table")
    batch = dict(input_ids=ids, positions=positions, slots=slots, seq_lens=lens,
                 block_tables=tables.fill([s.block_table for s in seqs], bucket, dummy_block))
    if cross_width:
        batch["encoder_lens"] = np.array([len(s.encoder_token_ids) for s in seqs] + [1] * (bucket - n), np.int64)
        batch["cross_block_tables"] = (cross_tables or HostBlockTables(bucket, cross_width, "cross block table")).fill(
            [s.cross_block_table for s in seqs], bucket, 0)
    return DecodeBatch(bucket, n, **batch)


class CudaGraphCapture:
    """The one place torch.cuda.graph is used: capture `fn` into a graph, replay it."""

    def __init__(self):
        self.pool = None

    def capture(self, fn):
        """Run nothing; record `fn()` and return (graph, its outputs)."""
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = fn()
        return graph, outputs

    @staticmethod
    def warm_up(fn):
        """Run `fn()` eagerly on a side stream, as torch recommends before capturing (workspaces, lazy init)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(stream)
        return out

    @staticmethod
    def replay(graph) -> None:
        graph.replay()


@dataclass
class _Captured:
    graph: object
    logits: torch.Tensor
    events: tuple
    finite: tuple


class DecodeGraphs:
    """One engine's decode graphs: static buffers, one captured forward per bucket, replays."""

    def __init__(self, max_num_seqs: int, width: int, block_size: int, dummy_block: int, device,
                 cross_width: int = 0, watch_finite: bool = True):
        self.buckets = batch_buckets(max_num_seqs)
        self.width, self.cross_width = width, cross_width
        self.block_size, self.dummy_block = block_size, dummy_block
        self.device = torch.device(device)
        self.watch_finite = watch_finite         # ForwardContext.watch_finite of the captured forwards
        self.seam = CudaGraphCapture()
        self.captured: dict[int, _Captured] = {}
        self._static: dict[str, torch.Tensor] | None = None
        self._views: dict[int, dict[str, torch.Tensor]] = {}      # per bucket: its rows of the static buffers
        self._host_tables = HostBlockTables(self.buckets[-1], width, "block table")
        self._host_cross = HostBlockTables(self.buckets[-1], max(1, cross_width), "cross block table")

    def fits(self, seqs) -> bool:
        """Whether a decode batch can run through a graph: a bucket holds it and every block table fits."""
        return (bucket_for(len(seqs), self.buckets) is not None
                and all(len(s.block_table) <= self.width for s in seqs)
                and (not self.cross_width or all(len(s.cross_block_table) <= self.cross_width for s in seqs)))

    def clear(self) -> None:
        """Drop every graph (sleep: the arena's addresses they hold may change); static buffers stay."""
        self.captured.clear()

    def _buffers(self) -> dict[str, torch.Tensor]:
        if self._static is None:
            n, dev = self.buckets[-1], self.device
            # input ids, positions, slots and sequence lengths: one copy per step
            inputs = torch.zeros(4, n, dtype=torch.long, device=dev)
            self._staged = torch.zeros(4, n, dtype=torch.long, pin_memory=dev.type == "cuda")
            self._staged_rows = self._staged.numpy()          # the same pinned memory, written with numpy
            self._static = {
                "token_inputs": inputs, "input_ids": inputs[0], "positions": inputs[1], "slots": inputs[2],
                "seq_lens_long": inputs[3],                   # copied to seq_lens (int32) inside the graph
                "seq_lens": torch.ones(n, dtype=torch.int32, device=dev),
                "block_tables": torch.zeros(n, self.width, dtype=torch.int32, device=dev),
                "query_start_loc": torch.arange(n + 1, dtype=torch.int32, device=dev),
                "encoder_lens": torch.ones(n, dtype=torch.int32, device=dev),
                "cross_block_tables": torch.zeros(n, max(1, self.cross_width), dtype=torch.int32, device=dev),
            }
        return self._static

    def _load(self, batch: DecodeBatch) -> dict[str, torch.Tensor]:
        """Copy the padded batch into the static buffers; return the bucket's views of them."""
        buf, b = self._buffers(), batch.bucket
        self._staged_rows[:, :b] = (batch.input_ids, batch.positions, batch.slots, batch.seq_lens)
        buf["token_inputs"][:, :b].copy_(self._staged[:, :b], non_blocking=True)
        tables = [("block_tables", self._host_tables)] + ([("cross_block_tables", self._host_cross)]
                                                          if self.cross_width else [])
        for name, host in tables:
            if host.changed is not None:
                r0, r1, c0, c1 = host.changed
                buf[name][r0:r1, c0:c1].copy_(torch.from_numpy(np.ascontiguousarray(host.array[r0:r1, c0:c1])))
        if self.cross_width:
            buf["encoder_lens"][:b].copy_(torch.from_numpy(batch.encoder_lens))
        if b not in self._views:
            self._views[b] = {name: t[: b + 1] if name == "query_start_loc" else t[:b] for name, t in buf.items()
                              if name != "token_inputs"}
        return self._views[b]

    def _metadata(self, views: dict[str, torch.Tensor]) -> AttentionMetadata:
        md = AttentionMetadata(is_prefill=False, slot_mapping=views["slots"], query_start_loc=views["query_start_loc"],
                               seq_lens=views["seq_lens"], block_tables=views["block_tables"], max_query_len=1,
                               max_seq_len=self.width * self.block_size)
        if self.cross_width:
            md.cross = CrossMetadata(encoder_seq_lens=views["encoder_lens"], block_tables=views["cross_block_tables"])
        return md

    def decode(self, seqs, bindings, step: int, forward) -> tuple[ForwardContext, torch.Tensor]:
        """One decode step of `seqs` through its bucket's graph: the context and the real rows' logits."""
        bucket = bucket_for(len(seqs), self.buckets)
        batch = pad_decode_batch(seqs, bucket, self.width, self.block_size, self.dummy_block, self.cross_width,
                                 self._host_tables, self._host_cross)
        views = self._load(batch)
        captured = self.captured.get(bucket)
        if captured is None:
            md = self._metadata(views)
            ctx = ForwardContext(attn_metadata=md, bindings=bindings, step=step, watch_finite=self.watch_finite)
            def run(c):     # the lengths' int32 copy is the graph's first step: one launch fewer outside it
                views["seq_lens"].copy_(views["seq_lens_long"])
                return forward(views["input_ids"], views["positions"], c)
            logits = self.seam.warm_up(lambda: run(ctx))
            recording = ForwardContext(attn_metadata=md, bindings=bindings, step=step, watch_finite=self.watch_finite)
            graph, (out,) = self.seam.capture(lambda: (run(recording),))
            if recording.scale_fills:
                raise RuntimeError(f"capturing the decode graph of batch {bucket} filled a scale region "
                                   f"({recording.scale_fills[0].layer}): a graph must not hold a fill")
            self.captured[bucket] = _Captured(graph, out, tuple(recording.events), tuple(recording.finite))
            ctx.cuda_graph, ctx.graph_batch = "captured", bucket
            return ctx, logits[: batch.num_real]
        self.seam.replay(captured.graph)
        ctx = ForwardContext(attn_metadata=self._metadata(views), bindings=bindings, step=step,
                             events=list(captured.events), finite=list(captured.finite))
        ctx.cuda_graph, ctx.graph_batch = "replayed", bucket
        return ctx, captured.logits[: batch.num_real]
