"""kv_sharing_fast_prefill (vLLM's option): in a prefill step the layers that share another layer's K/V run only on
each sequence's last token. They write no K/V, so the other rows can change nothing later: the tokens are those
of the full prefill and the logits equal up to float rounding, for every cache format, with the prompts spread
over several prefill steps and with prefix caching; and the shortcut really runs (the first sharing layer sees
one row a sequence)."""
from __future__ import annotations

import pytest
import torch

import minikv
from minikv.kernels.errors import InvalidTypeError

MODEL = "tiny-gemma4"                 # 8 layers, the last 4 sharing K/V
PROMPTS = ["389 391 393", "10 17 24 31 38 45 52", "5 10 15 20 25 30 35 40 45 50 55", "389 391 393 395"]


def _run(fast: bool, fmt: str, backend: str = "torch", **kw):
    llm = minikv.LLM(model=MODEL, kv_cache_dtype=fmt, backend=backend, kv_sharing_fast_prefill=fast, **kw)
    net = llm.runner.model
    rows = []                                       # rows the first sharing layer's MLP saw, per prefill step
    layer = net.model.layers[net.config.first_kv_shared_layer]
    hook = layer.mlp.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[-2]))
    params = minikv.SamplingParams(temperature=0, max_tokens=5, logprobs=3)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    hook.remove()
    return outs, rows


def _logprob_rows(outs):
    return [[sorted(step.items()) for step in o.outputs[0].logprobs] for o in outs]


@pytest.mark.parametrize("fmt", ["auto", "fp8", "int8_per_token_head", "fp8_per_token_head"])
@pytest.mark.parametrize("kw", [{}, {"max_num_batched_tokens": 40, "max_num_seqs": 2},
                                {"enable_prefix_caching": True, "block_size": 8}], ids=["one-step", "two-a-step",
                                                                                        "prefix-cached"])
def test_the_shortcut_gives_the_full_prefills_tokens_and_logits(fmt, kw):
    full, full_rows = _run(False, fmt, **kw)
    fast, fast_rows = _run(True, fmt, **kw)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in full]
    for a, b in zip(_logprob_rows(fast), _logprob_rows(full)):
        for step_a, step_b in zip(a, b):
            assert [t for t, _ in step_a] == [t for t, _ in step_b]
            assert torch.allclose(torch.tensor([lp.logprob for _, lp in step_a]),
                                  torch.tensor([lp.logprob for _, lp in step_b]), atol=1e-4)
    # the same number of layer calls; a prefill call of the shortcut sees one row per sequence, fewer in all
    assert len(fast_rows) == len(full_rows) and sum(fast_rows) < sum(full_rows)


def test_a_model_without_sharing_layers_ignores_the_option():
    llm = minikv.LLM(model="tiny-t5", backend="torch", kv_sharing_fast_prefill=True)
    out = llm.generate(["abcdef"], minikv.SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_the_option_is_checked():
    with pytest.raises(InvalidTypeError, match="kv_sharing_fast_prefill"):
        minikv.LLM(model=MODEL, backend="torch", kv_sharing_fast_prefill="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["auto", "fp8_per_token_head"])
def test_the_shortcut_on_the_compiled_kernels(fmt):
    kw = {"device": "cuda", "dtype": torch.bfloat16, "enable_prefix_caching": True, "block_size": 16}
    full, _ = _run(False, fmt, backend="triton", **kw)
    fast, rows = _run(True, fmt, backend="triton", **kw)
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in full]
    assert rows[0] == len(PROMPTS)                 # the first prefill step: one row per sequence


def test_the_hunter_draws_the_option_where_the_model_shares_kv():
    """The hunter's scenarios turn the option on and off on a model with KV-sharing layers (so its oracles check
    the shortcut), and the engine it builds receives it; a model without such layers never draws it."""
    from hypothesis import find, settings

    from minikv.hunt import strategies
    quick = settings(database=None, max_examples=200)
    on = find(strategies.scenarios((MODEL, "auto", "float32")), lambda s: s.kv_sharing_fast_prefill, settings=quick)
    assert on.engine_kwargs()["kv_sharing_fast_prefill"] is True
    assert strategies.model_shares_kv(MODEL) and not strategies.model_shares_kv("tiny-t5")
