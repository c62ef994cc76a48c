"""CUDA-graph decode on a GPU: the same token ids as eager decoding for both shipped models, every format, both
scale placements, prefix caching off and on; the trace says which steps captured and replayed (skipped without a
GPU; `make test-gpu` runs it). The bookkeeping itself is checked on CPU in tests/test_cuda_graph_decode.py."""
from __future__ import annotations

import pytest
import torch

import minikv

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORMATS = [("auto", "row"), ("fp8", "row"), ("int8_per_token_head", "row"), ("int8_per_token_head", "block"),
           ("fp8_per_token_head", "row"), ("fp8_per_token_head", "block")]


def _generate(model, fmt, placement, prefix, prompts, enforce_eager):
    llm = minikv.LLM(model=model, kv_cache_dtype=fmt, kv_scale_placement=placement, device="cuda",
                     max_num_seqs=8, enable_prefix_caching=prefix, enforce_eager=enforce_eager)
    for p in prompts:
        llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=10))
    tokens, graph_steps = {}, []
    while llm.has_unfinished():
        out = llm.step()
        if out.phase == "decode":
            graph_steps.append((out.trace.cuda_graph, out.trace.graph_batch, len(out.request_ids)))
        for rid, t in out.sampled.items():
            tokens.setdefault(rid, []).append(t)
    llm.arena.check()
    return tokens, graph_steps


@pytest.mark.parametrize("fmt,placement", FORMATS)
@pytest.mark.parametrize("model", ["tiny-gemma4", "tiny-t5"])
def test_graph_decode_gives_eager_tokens(model, fmt, placement):
    task = minikv.tasks.for_model(model)
    prompts = task.prompts(12, seed=3)
    prompts += prompts[:3]                         # repeated prompts: prefix-cache hits when it is on
    for prefix in (False, True):
        eager, eager_steps = _generate(model, fmt, placement, prefix, prompts, True)
        graphed, steps = _generate(model, fmt, placement, prefix, prompts, None)
        assert graphed == eager, f"prefix caching {prefix}"
        assert {s[0] for s in eager_steps} == {"eager"}
        assert {s[0] for s in steps} == {"captured", "replayed"}
        assert all(b >= n for _, b, n in steps)
        captured = [b for kind, b, _ in steps if kind == "captured"]
        assert len(captured) == len(set(captured))            # each bucket captured once, then replayed
