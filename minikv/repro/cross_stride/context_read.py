"""Defect B2's runs: each cross-attention output compared with attention over the exact encoder K/V, for the
historical fused context read, upstream's fallback and minikv's taught fused path (`run_context`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from minikv.repro.common import dequantized_rows

from .run import MODEL, engine, task_of


@dataclass
class ContextRun:
    version: str
    context_error: float     # `relative_error` of the cross-attention output at the context step (max over all)
    decode_error: float      # the same over all decode steps
    path: str                # which context path ran
    tokens_equal_auto: bool
    read_end: int = 0        # one past the farthest pool byte the context step's read layout addresses
    pool_bytes: int = 0
    wrong: list[int] = field(default_factory=list)                     # requests whose token ids differ from auto
    samples: list[tuple[float, float]] = field(default_factory=list)   # (exact, got) pairs at the context step


def read_extent(layout, block_table_row, length: int) -> int:
    """One past the farthest byte (from the pool start) a paged reader with `layout` touches for one sequence."""
    from minikv.kernels.addressing import row_byte_offsets, sequence_slots
    slots = sequence_slots(block_table_row, length, layout.block_size)
    return int(row_byte_offsets(layout, slots, 1).max()) + layout.head_size * layout.elem_bytes


def _attend_exact(q, k, v, sm_scale):
    """Non-causal attention of q [n, Hq, D] over k, v [S, Hkv, D] in float32 (T5: sm_scale 1, no bias)."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,shd->hns", q.float(), k) * sm_scale
    return torch.einsum("hns,shd->nhd", scores.softmax(-1), v)


def relative_error(got: torch.Tensor, exact: torch.Tensor) -> float:
    """max |got - exact| / max |exact|: the statistic of every B2 error (inf when `got` holds inf or NaN)."""
    err = float((got.float() - exact).abs().max() / exact.abs().max().clamp_min(1e-12))
    return err if math.isfinite(err) else float("inf")


def run_context(prompts, reference, version: str, device="cpu", backend="triton", model: str = MODEL) -> ContextRun:
    """Drive the engine step by step, capturing every cross layer's q, k, v and output, and compare each step's
    output with exact attention; record how far into the pool the fused context read reaches."""
    import minikv
    kwargs = {"historical": dict(reintroduce=("cross-fp8-context-read",)),
              "fallback": dict(repro=minikv.ReproConfig(cross_context_path="fallback")),
              "taught-fused": dict(repro=minikv.ReproConfig(cross_context_path="fused"))}[version]
    llm = engine("fp8", device, backend, model, max_num_seqs=len(prompts), **kwargs)
    encoder_kv: dict = {}
    errors = {True: [0.0], False: [0.0]}
    paths = set()
    extent = [0]
    samples = []

    task = task_of(model)
    ids = [llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p))) for p in prompts]
    results = {}
    while llm.has_unfinished():
        out = llm.step(capture=True)          # every cross layer's q, k, v and output, per step
        is_prefill = out.is_prefill
        q_lens = [len(out.slot_mapping[rid]) for rid in out.request_ids]
        enc_lens = [len(out.cross_slot_mapping[rid]) for rid in out.request_ids] if is_prefill else []
        for e in out.trace.events:
            if e.kind != "cross":
                continue
            t = e.tensors
            impl = llm.attention_layers[e.layer].impl
            qa = ea = 0
            for i, rid in enumerate(out.request_ids):
                key = (e.layer, out.cross_block_tables[rid])
                if is_prefill:
                    slots = out.cross_slot_mapping[rid]
                    cached = dequantized_rows(llm.arena.layout(e.pool), llm.arena.pool(e.pool), list(slots))
                    encoder_kv[key] = {"unfused": (t["k"][ea:ea + enc_lens[i]], t["v"][ea:ea + enc_lens[i]]),
                                       "paged": cached}
                    ea += enc_lens[i]
                    paths.add(e.context_path)
                    if e.context_path == "fused":
                        read = e.read_layout            # what the fused kernel was told the pool holds
                        table = torch.tensor(out.cross_block_tables[rid])
                        extent[0] = max(extent[0], read_extent(read, table, enc_lens[i]))
                # The reference is what this path is meant to read: the 16-bit workspace K/V for the unfused
                # context path, the cache's FP8 contents (dequantized with the pool's layout) for paged reads.
                # Against the 16-bit K/V, FP8 rounding alone moves T5's unscaled, near-argmax attention a lot.
                unfused = is_prefill and e.context_path == "unfused"
                kk, vv = encoder_kv[key]["unfused" if unfused else "paged"]
                q = t["q"][qa:qa + q_lens[i]]
                ref = _attend_exact(q, kk, vv, impl.sm_scale)
                got = t["out"][qa:qa + q_lens[i]].float()
                qa += q_lens[i]
                errors[is_prefill].append(relative_error(got, ref))
                if is_prefill:
                    samples += list(zip(ref.flatten().tolist(), got.flatten().tolist()))
        results.update({r.request_id: r.token_ids for r in out.finished})
    tokens = [results[i] for i in ids]
    wrong = [i for i, (t, r) in enumerate(zip(tokens, reference)) if t != r]
    cross_pool = next(a.kv_cache for a in llm.attention_layers.values() if a.kind == "cross")
    return ContextRun(version, max(errors[True]), max(errors[False]), "/".join(sorted(paths)),
                      tokens == reference, extent[0], cross_pool.numel(), wrong, samples)
