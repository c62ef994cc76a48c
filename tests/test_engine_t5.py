"""T5 through minikv's paged engine: decoder self attention on the paged cache with the relative bias table,
cross attention over the cross pool (both unscaled), the encoder dense.

A random tiny T5 saved by transformers gives, through the engine (both backends), the same greedy ids as
transformers' `generate` with the `auto` cache, and with a quantized cache the same ids as minikv's dense model
fake-quantizing its decoder K/V the same way (random weights have near-ties that quantization noise flips, so
transformers' unquantized ids are not the reference there; the dense model itself matches transformers, see
tests/test_parity_t5.py). Generations are longer than the bias's max distance, so the kernels' clamp of far
keys is exercised. The shipped tiny-t5 gives the same ids as its dense greedy and solves its task,
and the cross-stride defect reproduces on it. The engine loads the random checkpoint from its directory.
"""
from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the dev extra: pip install -e .[dev]")

import minikv
from minikv import tasks
from minikv.models import registry, train
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.hf_checkpoint import load_checkpoint
from minikv.models.t5 import relative_position_bucket
from minikv.models.tokenizer import CharTokenizer

PROMPTS = ["hello world", "abc", "the quick brown fox jumps", "zz9"]
NEW_TOKENS = 18          # > relative_attention_max_distance below: the last decode steps see clamped distances
CONFIG = {"vocab_size": CharTokenizer().vocab_size, "d_model": 32, "d_kv": 16, "d_ff": 48, "num_layers": 2,
          "num_heads": 4, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
          "relative_attention_num_buckets": 8, "relative_attention_max_distance": 12}


@pytest.fixture(scope="module")
def random_t5(tmp_path_factory):
    """(checkpoint directory, {kv format: reference greedy ids per prompt}): transformers' for auto, minikv's
    dense fake-quantized model's for the quantized formats."""
    torch.manual_seed(0)
    hf = transformers.T5ForConditionalGeneration(
        transformers.T5Config(**CONFIG, decoder_start_token_id=0, dropout_rate=0.0)).eval()
    hf.lm_head.weight = torch.nn.Parameter(hf.shared.weight.detach().clone())   # untied, as flan-t5
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.25) + (p.dim() == 1))
    hf.generation_config.eos_token_id = None
    path = tmp_path_factory.mktemp("t5_engine")
    hf.save_pretrained(path)
    tok = CharTokenizer()
    save_char_tokenizer(tok, path)
    ours = load_checkpoint(path)
    expected = {"auto": []}
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([tok.encode(prompt)])
            expected["auto"].append(hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0, 1:].tolist())
            assert ours.greedy(ids, NEW_TOKENS)[0].tolist() == expected["auto"][-1]
        for fmt in ("int8_per_token_head", "fp8"):
            ours.kv_transform = train.kv_transform_for(fmt)
            expected[fmt] = [ours.greedy(torch.tensor([tok.encode(p)]), NEW_TOKENS)[0].tolist() for p in PROMPTS]
    assert expected["fp8"] != expected["auto"]      # the quantized references really differ from the unquantized
    return path, expected


def test_bias_table_equals_the_bucketed_bias_at_every_distance():
    model = registry.load_model("tiny-t5")
    c = model.config
    table = model.decoder_bias_table()
    assert table.dtype == torch.float32 and table.shape == (c.num_heads, c.relative_attention_max_distance + 1)
    distance = torch.arange(0, 1000)
    buckets = relative_position_bucket(-distance, False, c.relative_attention_num_buckets,
                                       c.relative_attention_max_distance)
    learned = model.decoder.block[0].self_attn.relative_attention_bias.weight.detach()
    assert torch.equal(table[:, distance.clamp(max=c.relative_attention_max_distance)], learned[buckets].t())


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head", "fp8"])
def test_engine_greedy_equals_transformers_or_dense_fake_quant(random_t5, monkeypatch, backend, kv_cache_dtype):
    path, expected = random_t5
    llm = minikv.LLM(model=str(path), backend=backend, kv_cache_dtype=kv_cache_dtype, max_num_seqs=4, block_size=8)
    impls = [a.impl for a in llm.attention_layers.values()]
    assert {i.sm_scale for i in impls} == {1.0}
    n = CONFIG["num_layers"]
    assert [a.kind for a in llm.attention_layers.values()] == ["self"] * n + ["cross"] * n
    # the self layers' relative bias, passed down with every step's forward context (greedy ids below use it)
    assert llm.model.decoder_bias_table().shape == (CONFIG["num_heads"], CONFIG["relative_attention_max_distance"] + 1)
    outs = llm.generate(PROMPTS, minikv.SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == expected[kv_cache_dtype]


def _without_eos(ids: list[int], eos: int) -> list[int]:
    return ids[:-1] if ids and ids[-1] == eos else ids


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_tiny_t5_engine_equals_dense_greedy_and_solves_the_task(kv_cache_dtype):
    task = tasks.for_model("tiny-t5")
    prompts = task.prompts(30, seed=13)
    llm = minikv.LLM(model="tiny-t5", backend="torch", kv_cache_dtype=kv_cache_dtype, max_num_seqs=8)
    outs = llm.generate(prompts, [minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p)) for p in prompts],
                        use_tqdm=False)
    model = registry.load_model("tiny-t5")
    model.kv_transform = train.kv_transform_for(None if kv_cache_dtype == "auto" else kv_cache_dtype)
    dense = train.generate_dense(model, prompts, max(task.max_tokens(p) for p in prompts))
    eos = llm.tokenizer.eos_id
    assert [o.token_ids for o in outs] == [_without_eos(d, eos) for d in dense]
    assert all(task.check(p, o.text) for p, o in zip(prompts, outs))


def test_cross_stride_reproduces_on_tiny_t5():
    """B1 on T5: with the historical stride, a cross pool that holds the blocks but less than twice them overruns
    (the sanitizer catches it); the fixed engine's fp8 ids equal the auto run's."""
    task = tasks.for_model("tiny-t5")
    prompts = task.prompts(4, seed=2)
    params = [minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p)) for p in prompts]
    auto = minikv.LLM(model="tiny-t5", backend="torch", max_num_seqs=4)
    need = auto.cross_blocks_needed(prompts)
    reference = [o.token_ids for o in auto.generate(prompts, params, use_tqdm=False)]
    blocks = math.floor(1.5 * need)
    assert need <= blocks < 2 * need
    buggy = minikv.LLM(model="tiny-t5", backend="torch", kv_cache_dtype="fp8", reintroduce=("cross-stride",),
                       repro=minikv.ReproConfig(check_layout=False), sanitize=True, cross_pool_blocks=blocks, max_num_seqs=4)
    with pytest.raises(minikv.KVCacheOverrunError, match="cross."):
        buggy.generate(prompts, params, use_tqdm=False)
    fixed = minikv.LLM(model="tiny-t5", backend="torch", kv_cache_dtype="fp8", sanitize=True,
                       cross_pool_blocks=blocks, max_num_seqs=4)
    assert [o.token_ids for o in fixed.generate(prompts, params, use_tqdm=False)] == reference
