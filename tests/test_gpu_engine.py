"""The engine and both reproductions compiled on a CUDA GPU (skipped without one; `make test-gpu` runs them)."""
from __future__ import annotations

import math

import pytest
import torch

import minikv

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("fmt", ["auto", "fp8", "int8_per_token_head", "fp8_per_token_head"])
def test_gemma4_triton_equals_torch_backend_and_is_right(fmt):
    task = minikv.tasks.for_model("tiny-gemma4")
    prompts = task.prompts(16, seed=0)
    outs = {}
    for backend in ("triton", "torch"):
        llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype=fmt, device="cuda", backend=backend, max_num_seqs=8)
        outs[backend] = llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
        llm.arena.check()
    assert [o.token_ids for o in outs["triton"]] == [o.token_ids for o in outs["torch"]]
    assert sum(task.check(p, o.text) for p, o in zip(prompts, outs["triton"])) >= 15


@pytest.mark.parametrize("max_num_seqs", [4, 8])
def test_scale_wipe_on_gpu(max_num_seqs):
    from minikv.repro import scale_wipe
    prompts = scale_wipe.make_prompts(3 * max_num_seqs)
    fixed = scale_wipe.run_engine("int8_per_token_head", max_num_seqs, False, False, prompts, device="cuda")
    buggy = scale_wipe.run_engine("int8_per_token_head", max_num_seqs, False, True, prompts, device="cuda")
    scale_wipe.compare(fixed, buggy)
    assert buggy.damaged == list(range(max_num_seqs)) and fixed.damaged == []
    assert buggy.inflation_error < 1e-4


def test_cross_stride_on_gpu():
    from minikv.repro import cross_stride
    prompts = cross_stride.make_prompts(6)
    reference = cross_stride.reference_tokens(prompts, device="cuda")
    need = minikv.LLM(model="tiny-t5", kv_cache_dtype="fp8", device="cuda").cross_blocks_needed(prompts)
    assert math.floor(1.5 * need) < 2 * need
    run = cross_stride.run_pool
    assert run(prompts, reference, 1.5, need, True, True, device="cuda").outcome == "overrun caught"
    assert run(prompts, reference, 1.5, need, False, True, device="cuda").outcome == "correct"
    assert run(prompts, reference, 2.0, need, True, True, device="cuda").outcome == "correct"
