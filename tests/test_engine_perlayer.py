"""Gemma-4 with per-layer-type head sizes and KV-head counts through the paged engine.

Real Gemma-4 checkpoints give full-attention layers other heads than sliding ones (gemma-4-E2B: head size 256 on
sliding layers, 512 on full ones). The engine allocates each layer's pool with that layer's own `KVLayout`, and a
KV-sharing layer addresses its source's pool with its source's layout. Checked here on a tiny random config shaped
like E2B's pattern scaled down (sliding heads of 16 x 2 KV heads, full heads of 32 x 1 KV head, the last half of
the layers sharing the caches of the last sliding and the last full non-shared layer, two or more sharers each):
greedy ids through the engine equal transformers' `generate` for the `auto` cache, and equal minikv's dense model
with the same fake quantization for the quantized caches; both backends. One E2B-shaped model at the real head
sizes 256 / 512: on CPU through the Triton interpreter in float32, and on a GPU in bfloat16, its logits at every
step against the dense model's.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the dev extra: pip install -e .[dev]")

import minikv
from minikv.models import registry, train
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import FULL, SLIDING, Gemma4Config, Gemma4ConfigError, Gemma4ForCausalLM
from minikv.models.hf_checkpoint import load_checkpoint, save_checkpoint
from minikv.models.tokenizer import CharTokenizer

S, F = SLIDING, FULL
PROMPTS = ["3 7 11 15", "10 20 30", "5", "123 456 789 1011"]
NEW_TOKENS = 10
LAYER_TYPES = [S, S, S, S, F, S, S, S, F, F]          # 4 sliding : 1 full, last layer full, as E2B
SHARED = 5                                             # layers 5-9 share: 5, 6, 7 read layer 3; 8, 9 read layer 4


def perlayer_config(**overrides) -> dict:
    """transformers' Gemma4TextConfig arguments: full layers get their own head size and KV-head count through
    `per_layer_config` (what `global_head_dim` / `num_global_key_value_heads` resolve to)."""
    full = {"head_dim": 32, "num_key_value_heads": 1}
    return {
        "vocab_size": CharTokenizer().vocab_size, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": len(LAYER_TYPES), "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "per_layer_config": {i: full for i, t in enumerate(LAYER_TYPES) if t == F},
        "layer_types": LAYER_TYPES, "sliding_window": 8, "max_position_embeddings": 64,
        "num_kv_shared_layers": SHARED, "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": CharTokenizer().vocab_size, "final_logit_softcapping": 30.0,
        **overrides,
    }


def random_checkpoint(path, config: dict, scale: float = 0.25, jitter: float = 0.3):
    """A transformers Gemma-4 with every parameter drawn at random (matrices with std `scale`, vectors around 1
    with std `jitter`), saved with minikv's tokenizer spec."""
    torch.manual_seed(0)
    hf = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**config)).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (jitter if p.dim() == 1 else scale) + (p.dim() == 1))
    hf.generation_config.eos_token_id = None
    hf.save_pretrained(path)
    save_char_tokenizer(CharTokenizer(), path)
    return hf


@pytest.fixture(scope="module")
def perlayer(tmp_path_factory):
    """(checkpoint directory, {kv format: reference greedy ids per prompt}): transformers' for auto, minikv's
    dense fake-quantized model's for the quantized formats."""
    path = tmp_path_factory.mktemp("gemma4_perlayer")
    hf = random_checkpoint(path, perlayer_config())
    ours = load_checkpoint(path)
    tok = CharTokenizer()
    expected = {"auto": []}
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
            expected["auto"].append(hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[0, ids.shape[1]:]
                                    .tolist())
            assert ours.greedy(ids, NEW_TOKENS)[0].tolist() == expected["auto"][-1]
        for fmt in ("int8_per_token_head", "fp8_per_token_head", "fp8"):
            ours.kv_transform = train.kv_transform_for(fmt)
            expected[fmt] = [ours.greedy(torch.tensor([[tok.bos_id, *tok.encode(p)]]), NEW_TOKENS)[0].tolist()
                             for p in PROMPTS]
    assert expected["fp8"] != expected["auto"]      # the quantized references really differ from the unquantized
    return path, expected


def test_the_config_really_has_two_head_shapes(perlayer):
    path, _ = perlayer
    c = load_checkpoint(path).config
    assert set(zip(c.layer_types, c.layer_head_dims, c.layer_kv_heads)) == {(S, 16, 2), (F, 32, 1)}
    assert c.kv_sharing == {5: 3, 6: 3, 7: 3, 8: 4, 9: 4}
    with pytest.raises(Gemma4ConfigError, match="layer_head_dims"):
        c.head_size                                  # noqa: B018  (no single head size to report)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head", "fp8_per_token_head", "fp8"])
def test_engine_greedy_equals_reference(perlayer, monkeypatch, backend, kv_cache_dtype):
    path, expected = perlayer
    llm = minikv.LLM(model=str(path), backend=backend, kv_cache_dtype=kv_cache_dtype, max_num_seqs=4, block_size=8)
    layouts = llm.kv_layouts
    assert {n: (lay.head_size, lay.num_kv_heads) for n, lay in layouts.items()} == {
        f"kv.model.layers.{i}.self_attn": (32, 1) if LAYER_TYPES[i] == F else (16, 2) for i in range(SHARED)}
    assert llm.kv_layout == layouts["kv.model.layers.0.self_attn"]           # the first self-attention pool's
    for name, a in llm.attention_layers.items():
        owner = a.kv_sharing_target or name
        assert a.impl.layout == layouts[f"kv.{owner}"]                       # sharers address the source's pool
        assert a.kv_cache is llm.arena.pool(f"kv.{owner}")                   # ... through the same tensor object
        assert a.kv_cache.shape[1] == layouts[f"kv.{owner}"].block_bytes
    outs = llm.generate(PROMPTS, minikv.SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True), use_tqdm=False)
    assert [o.token_ids for o in outs] == expected[kv_cache_dtype]
    llm.arena.check()


def test_sharing_layer_with_another_shape_than_its_source_is_refused(tmp_path, monkeypatch):
    """A config may give a sharing layer another KV-head count than its source; the source's pool could not hold
    that layer's K/V, so the engine refuses to build it, naming both layers."""
    full, wider = {"head_dim": 32, "num_key_value_heads": 1}, {"head_dim": 32, "num_key_value_heads": 2}
    config = Gemma4Config.from_hf_dict({**perlayer_config(), "per_layer_config": {"4": full, "8": full, "9": wider}})
    assert config.kv_sharing[9] == 4 and config.layer_kv_heads[9] != config.layer_kv_heads[4]
    save_checkpoint(Gemma4ForCausalLM(config).eval(), tmp_path)
    save_char_tokenizer(CharTokenizer(), tmp_path)
    with pytest.raises(ValueError, match=r"model.layers.9.self_attn shares the KV cache of model.layers.4.self_attn"):
        minikv.LLM(model=str(tmp_path), backend="torch", block_size=8)


def test_unsupported_head_size_names_the_layer(tmp_path):
    config = Gemma4Config.from_hf_dict({**perlayer_config(), "per_layer_config": {
        str(i): {"head_dim": 48} for i, t in enumerate(LAYER_TYPES) if t == F}})
    save_checkpoint(Gemma4ForCausalLM(config).eval(), tmp_path)
    save_char_tokenizer(CharTokenizer(), tmp_path)
    with pytest.raises(ValueError, match=r"model.layers.4.self_attn: .*unsupported head size 48; .*take 16, 32"):
        minikv.LLM(model=str(tmp_path), backend="torch", block_size=8)


# ---- the real model's head sizes: interpreter (CPU) and GPU --------------------------------------------------------
def random_minikv_checkpoint(path, config: dict, scale: float, jitter: float) -> None:
    """As `random_checkpoint`, with minikv's own model and writer (no transformers needed: the GPU machine's may
    predate Gemma-4; the reference here is minikv's dense model)."""
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(Gemma4Config.from_hf_dict({**config, "model_type": "gemma4_text"})).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (jitter if p.dim() == 1 else scale) + (p.dim() == 1))
    save_checkpoint(model, path)
    save_char_tokenizer(CharTokenizer(), path)


def e2b_at_real_head_sizes() -> dict:
    """gemma-4-E2B's attention shapes (8 query heads, 1 KV head, head size 256 on sliding layers and 512 on full
    ones, sliding window 512) with fewer and narrower layers: the pattern and sharing of `perlayer_config`."""
    full = {"head_dim": 512, "num_key_value_heads": 1}
    return perlayer_config(hidden_size=256, intermediate_size=512, num_attention_heads=8, num_key_value_heads=1,
                           head_dim=256, per_layer_config={i: full for i, t in enumerate(LAYER_TYPES) if t == F},
                           sliding_window=512, max_position_embeddings=1024, hidden_size_per_layer_input=32)


GPU_PROMPTS = ["3 7 11 15", "10 20 30", "5", "123 456 789 1011 1213 1415 1617 1819 2021 2223 2425 2627 2829"]
GPU_NEW_TOKENS = 24


def engine_and_dense_logits(llm, dense, prompt: str, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([new_tokens, vocab] logits the engine sampled each token from, the dense model's logits at the same
    positions when it reads the engine's own sequence), both float32."""
    seen = []
    compute = llm.model.compute_logits

    def recording(hidden):
        seen.append(compute(hidden))
        return seen[-1]

    llm.model.compute_logits = recording
    try:
        out = llm.generate([prompt], minikv.SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True), use_tqdm=False)[0]
    finally:
        del llm.model.compute_logits
    tok = CharTokenizer()
    ids = [tok.bos_id, *tok.encode(prompt)]
    full = torch.tensor([ids + out.token_ids], device=next(dense.parameters()).device)
    return torch.cat(seen).float(), dense.logits(full)[0, len(ids) - 1: -1].float()


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head"])
@torch.no_grad()
def test_e2b_head_sizes_through_the_interpreter(tmp_path, monkeypatch, kv_cache_dtype):
    """Head sizes 256 / 512 run on CPU too (Triton interpreter, float32): the engine's logits at every step equal
    the dense model's (measured, as a fraction of the logits' spread: within 5e-5 with the auto cache, 1% at most
    with int8 codes; a misread pool is off by about 0.4 on average)."""
    random_minikv_checkpoint(tmp_path, e2b_at_real_head_sizes(), scale=0.2, jitter=0.05)
    llm = minikv.LLM(model=str(tmp_path), backend="triton", kv_cache_dtype=kv_cache_dtype, max_num_seqs=1,
                     block_size=16)
    assert {lay.head_size for lay in llm.kv_layouts.values()} == {256, 512}
    dense = load_checkpoint(tmp_path).eval()
    if kv_cache_dtype != "auto":
        dense.kv_transform = train.kv_transform_for(kv_cache_dtype)
    ours, expected = engine_and_dense_logits(llm, dense, "123 456 789", 8)
    spread = float((expected - expected.mean(dim=1, keepdim=True)).abs().mean())
    error = (ours - expected).abs()
    if kv_cache_dtype == "auto":
        assert float(error.max()) < 1e-3 * spread
    else:       # a code that lands on the other side of a rounding tie in one of the two moves a logit by ~1%
        assert float(error.mean()) < 5e-3 * spread and float(error.max()) < 0.05 * spread
    llm.arena.check()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (head sizes 256 / 512 in bfloat16)")
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head"])
@torch.no_grad()
def test_e2b_head_sizes_on_gpu_bf16(tmp_path, monkeypatch, backend, kv_cache_dtype):
    """At every context and decode step, the logits the engine samples from equal the dense bfloat16 model's
    (with the same fake quantization) at the same positions, to bfloat16 precision.

    Tolerances, as fractions of the mean |logit - row mean| ("spread"), from CPU measurements of this model (per
    prompt, mean and max error): the dense model in bfloat16 against float32 is off by 0.02-0.12 and 0.10-0.64,
    the engine against the dense model both in float16 by <= 0.009 and 0.06; with the full layers' K/V misread
    (each head vector rotated by one element, standing for a pool read with another layout) by 0.34-0.47 and
    1.5-1.9. The mean is the test (0.2); the max bound only catches a single wild step. Greedy tokens are no test
    here: even the misread model picks the same ones."""
    random_minikv_checkpoint(tmp_path, e2b_at_real_head_sizes(), scale=0.2, jitter=0.05)
    # eager: the logits are recorded by wrapping compute_logits, which a CUDA-graph replay does not call
    llm = minikv.LLM(model=str(tmp_path), backend=backend, kv_cache_dtype=kv_cache_dtype, device="cuda",
                     dtype=torch.bfloat16, max_num_seqs=1, block_size=16, enforce_eager=True)
    assert {lay.head_size for lay in llm.kv_layouts.values()} == {256, 512}
    dense = load_checkpoint(tmp_path).to("cuda", torch.bfloat16).eval()
    if kv_cache_dtype != "auto":
        dense.kv_transform = train.kv_transform_for(kv_cache_dtype)
    for prompt in GPU_PROMPTS:
        ours, expected = engine_and_dense_logits(llm, dense, prompt, GPU_NEW_TOKENS)
        assert ours.shape == expected.shape == (GPU_NEW_TOKENS, CharTokenizer().vocab_size)
        spread = (expected - expected.mean(dim=1, keepdim=True)).abs().mean()
        error = (ours - expected).abs()
        assert float(error.mean()) < 0.2 * float(spread), (prompt, float(error.mean()), float(spread))
        assert float(error.max()) < 1.5 * float(spread), (prompt, float(error.max()), float(spread))
    llm.arena.check()
