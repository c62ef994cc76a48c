"""CUDA-graph decode's bookkeeping on CPU (minikv.engine.cuda_graph): buckets, padding rows on the reserved block,
static buffers reused across steps, the step trace; the graph seam replaced by an eager stand-in. The GPU side
(real graphs, eager and graph token ids equal for every format) is tests/test_gpu_graphs.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import minikv
from minikv.config import EngineConfig
from minikv.engine import cuda_graph
from minikv.engine.cuda_graph import HostBlockTables, batch_buckets, bucket_for, pad_decode_batch


class EagerCapture:
    """A stand-in for CudaGraphCapture that runs on CPU: "capture" keeps the function, "replay" runs it again (into
    the same output tensors, as a graph replay writes its captured outputs)."""

    def __init__(self):
        self.captures = 0
        self.replays = 0

    def capture(self, fn):
        self.captures += 1
        holder = {"fn": fn, "out": fn()}
        return holder, holder["out"]

    @staticmethod
    def warm_up(fn):
        return fn()

    def replay(self, holder) -> None:
        self.replays += 1
        for dst, src in zip(holder["out"], holder["fn"]()):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)


@pytest.mark.parametrize("max_num_seqs, buckets", [(1, (1,)), (6, (1, 2, 4, 6)), (8, (1, 2, 4, 8)),
                                                   (30, (1, 2, 4, 8, 16, 24, 30)), (32, (1, 2, 4, 8, 16, 24, 32))])
def test_buckets(max_num_seqs, buckets):
    assert batch_buckets(max_num_seqs) == buckets
    assert [bucket_for(n, buckets) for n in range(1, max_num_seqs + 1)] == [min(b for b in buckets if b >= n)
                                                                           for n in range(1, max_num_seqs + 1)]
    assert bucket_for(max_num_seqs + 1, buckets) is None


class _Seq(SimpleNamespace):
    def __len__(self):
        return len(self.token_ids)


def test_padding_rows_use_only_the_reserved_block():
    seqs = [_Seq(token_ids=[5, 6, 7], block_table=[3]), _Seq(token_ids=list(range(9)), block_table=[1, 4, 2])]
    batch = pad_decode_batch(seqs, 4, width=5, block_size=4, dummy_block=9)
    assert batch.input_ids.tolist() == [7, 8, 0, 0] and batch.positions.tolist() == [2, 8, 0, 0]
    assert batch.slots.tolist() == [3 * 4 + 2, 2 * 4 + 0, 36, 36]          # padding: slot 0 of block 9
    assert batch.seq_lens.tolist() == [3, 9, 1, 1]
    assert batch.block_tables.tolist() == [[3, 0, 0, 0, 0], [1, 4, 2, 0, 0], [9, 0, 0, 0, 0], [9, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="does not fit"):
        pad_decode_batch(seqs, 4, width=2, block_size=4, dummy_block=9)


def test_kept_host_tables_equal_tables_written_anew_step_after_step():
    """HostBlockTables writes only what grew; after appends, a replaced list (a preemption's new table), a batch
    that shrank and one that grew again, its rows equal a fresh fill's, zeros and padding included, and a copy
    that takes only each fill's `changed` part stays equal to it."""
    import random
    rng = random.Random(0)
    kept = HostBlockTables(8, 12, "block table")
    mirror = kept.array.copy()
    seqs = [[rng.randrange(50) for _ in range(rng.randrange(1, 6))] for _ in range(6)]
    for step in range(40):
        for t in seqs:
            if len(t) < 12 and rng.random() < 0.4:
                t.append(rng.randrange(50))                       # may_append
        if step % 7 == 3:       # preempted, then allocated anew (its prompt and outputs): a new list, no shorter
            k = rng.randrange(len(seqs))
            seqs[k] = [rng.randrange(50) for _ in range(min(12, len(seqs[k]) + 1))]
        if step % 11 == 5:
            seqs = seqs[:3] if len(seqs) > 3 else seqs + [[1, 2]] * 3
        bucket = 4 if len(seqs) <= 4 else 8
        want = HostBlockTables(bucket, 12, "block table").fill(seqs, bucket, 49)
        assert kept.fill(seqs, bucket, 49).tolist() == want.tolist(), f"step {step}"
        if kept.changed is not None:            # what a device copy of the tables gets: the changed part alone
            r0, r1, c0, c1 = kept.changed
            mirror[r0:r1, c0:c1] = kept.array[r0:r1, c0:c1]
        assert mirror.tolist() == kept.array.tolist(), f"step {step}"
    assert kept.fill(seqs, bucket, 49) is not None and kept.changed is None      # nothing grew: nothing to copy
    with pytest.raises(ValueError, match="does not fit"):
        kept.fill([list(range(13))], 1, 0)


def _run(prompts, graphs: bool, monkeypatch, max_tokens=3):
    if graphs:     # graphs on CPU: the config says yes, the seam runs eagerly
        monkeypatch.setattr(EngineConfig, "cuda_graphs", property(lambda self: True))
        monkeypatch.setattr(cuda_graph, "CudaGraphCapture", EagerCapture)
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=4, seed=0)
    for p in prompts:
        llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=max_tokens))
    steps, tokens = [], {}
    while llm.has_unfinished():
        out = llm.step()
        steps.append((out.phase, out.trace.cuda_graph, out.trace.graph_batch, len(out.trace.events)))
        for rid, t in out.sampled.items():
            tokens.setdefault(rid, []).append(t)
    monkeypatch.undo()
    return llm, steps, tokens


def test_graph_decode_matches_eager_and_says_so_in_the_trace(monkeypatch):
    prompts = ["3 5 7", "4 5 6 7 8 9", "10 20"]
    _, eager_steps, eager = _run(prompts, False, monkeypatch)
    llm, steps, graphed = _run(prompts, True, monkeypatch)
    assert graphed == eager
    assert {s[1] for s in eager_steps} == {"eager"}
    decode = [s for s in steps if s[0] == "decode"]
    assert decode[0][1:3] == ("captured", 4) and all(s[1:3] == ("replayed", 4) for s in decode[1:])
    assert all(s[1] == "eager" for s in steps if s[0] == "prefill")
    assert len({s[3] for s in steps}) == 1          # a replay reports the captured step's cache events
    graphs = llm.runner.graphs
    assert set(graphs.captured) == {4} and graphs.seam.replays == len(decode) - 1
    assert llm.runner.pool_specs()[0].num_blocks == llm.runner.num_blocks + 1    # the padding block
    llm.sleep()
    assert graphs.captured == {}                    # sleep drops the graphs; the next decode captures again
