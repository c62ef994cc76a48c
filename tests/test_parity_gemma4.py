"""minikv's Gemma-4 text decoder against transformers' Gemma4ForCausalLM (transformers: dev dependency only).

Tiny random configs, float32 on CPU, every parameter (norm weights and layer scalars included) drawn at random
so that no term of the forward pass can hide behind an identity. Checked, through a checkpoint directory written
by one library and read by the other: logits of a whole-sequence forward, logits of prefill + token-by-token
decode through minikv's DenseKVCache, greedy ids against `generate`, and the KV-sharing topology.
"""
from __future__ import annotations

import inspect
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the dev extra: pip install -e .[dev]")

from safetensors.torch import load_file, save_file

from minikv.models import registry
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import FULL, SLIDING, DenseKVCache, Gemma4Config, Gemma4ForCausalLM
from minikv.models.hf_checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minikv.models.tokenizer import CharTokenizer

# float32. Against transformers' default (sdpa) attention the logits agree to the last bit on CPU; its eager
# attention rounds differently (softmax upcast), ~2e-4 on these deliberately ill-conditioned random models.
TOL = 1e-4
S, F = SLIDING, FULL


def e2b_shaped() -> dict:
    """gemma-4-E2B's layout scaled down: 4 sliding : 1 full, PLE, wider full-attention heads, and the last two
    thirds of the layers sharing KV, so layer 3 (sliding) feeds 8 sharers and layer 4 (full) feeds 2."""
    return {
        "vocab_size": 48, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 15,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8, "global_head_dim": 16,
        "layer_types": [S, S, S, S, F] * 3, "sliding_window": 4, "num_kv_shared_layers": 10,
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 48, "final_logit_softcapping": 30.0,
        "rope_parameters": {S: {"rope_type": "default", "rope_theta": 10_000.0},
                            F: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                "rope_theta": 1_000_000.0}},
    }


def variants() -> dict:
    """The other options: keys used as values on full layers with their own KV-head count, double-wide MLPs on
    sharing layers, an untied LM head, other RoPE parameters, a full layer in the shared block."""
    return {
        "vocab_size": 40, "hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 7,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 6, "global_head_dim": 12,
        "attention_k_eq_v": True, "num_global_key_value_heads": 1, "layer_types": [S, F, S, S, F, S, F],
        "sliding_window": 3, "num_kv_shared_layers": 3, "use_double_wide_mlp": True,
        "tie_word_embeddings": False, "hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 40,
        "final_logit_softcapping": None,
        "rope_parameters": {S: {"rope_type": "default", "rope_theta": 100.0},
                            F: {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 5_000.0}},
    }


def plain() -> dict:
    """No per-layer inputs and no KV sharing. (transformers 5.24 cannot run KV sharing without PLE: its
    prefill shortcut for the shared layers slices the absent per-layer inputs.)"""
    return {
        "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "global_head_dim": 8,
        "layer_types": [S, S, F], "sliding_window": 2, "hidden_size_per_layer_input": 0,
        "final_logit_softcapping": 5.0,
    }


CONFIGS = {"e2b_shaped": e2b_shaped, "variants": variants, "plain": plain}


def randomize_(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.25) + (p.dim() == 1))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)


def hf_model(kwargs: dict, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.Gemma4TextConfig(**kwargs, attn_implementation="sdpa")
    model = transformers.Gemma4ForCausalLM(config).eval()
    randomize_(model, seed)
    if not config.tie_word_embeddings:
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    model.generation_config.eos_token_id = None          # generate exactly max_new_tokens
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """(transformers model, minikv model loaded from the directory transformers saved, that directory)."""
    hf = hf_model(CONFIGS[request.param]())
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, load_checkpoint(path), path


def prompt(vocab: int, batch: int = 2, length: int = 11, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _cache_kw() -> str:
    params = inspect.signature(transformers.Gemma4ForCausalLM.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hf_incremental_logits(hf, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """transformers' own cache path: prefill, then one token per call."""
    out = hf(ids[:, :prefill], use_cache=True)
    logits = [out.logits]
    for t in range(prefill, ids.shape[1]):
        cache = getattr(out, "cache", None) or out.past_key_values
        out = hf(ids[:, t:t + 1], use_cache=True, **{_cache_kw(): cache})
        logits.append(out.logits)
    return torch.cat(logits, dim=1)


def minikv_incremental_logits(model: Gemma4ForCausalLM, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    cache = DenseKVCache()
    logits = [model.logits(ids[:, :prefill], cache)]
    for t in range(prefill, ids.shape[1]):
        logits.append(model.logits(ids[:, t:t + 1], cache))
    return torch.cat(logits, dim=1)


# ---- topology ----------------------------------------------------------------------------------------------------
def hf_kv_sources(config) -> list[int]:
    modes, types = config.kv_sharing_modes, config.layer_types
    store = {types[i]: i for i, m in enumerate(modes) if m == "store"}
    return [store[types[i]] if m == "reuse" else i for i, m in enumerate(modes)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_kv_sources_match_transformers(name):
    hf_config = transformers.Gemma4TextConfig(**CONFIGS[name]())
    ours = Gemma4Config.from_hf_dict(hf_config.to_dict())
    assert list(ours.kv_sources) == hf_kv_sources(hf_config)
    assert list(ours.layer_head_dims) == [hf_config.per_layer_config[i].head_dim for i in range(ours.num_hidden_layers)]
    assert list(ours.layer_kv_heads) == [hf_config.per_layer_config[i].num_key_value_heads
                                         for i in range(ours.num_hidden_layers)]


def test_e2b_shaped_topology_has_several_sharers_per_target():
    sources = Gemma4Config.from_hf_dict(transformers.Gemma4TextConfig(**e2b_shaped()).to_dict()).kv_sources
    sharers = {t: sum(1 for i, s in enumerate(sources) if s == t and i != t) for t in set(sources)}
    assert {t: n for t, n in sharers.items() if n} == {3: 8, 4: 2}


def test_random_layer_patterns_derive_like_transformers():
    rng = torch.Generator().manual_seed(7)
    checked = 0
    for _ in range(40):
        n = int(torch.randint(2, 12, (), generator=rng))
        types = [S if float(torch.rand((), generator=rng)) < 0.7 else F for _ in range(n)]
        types[-1] = F
        shared = int(torch.randint(0, n, (), generator=rng))
        kwargs = {"num_hidden_layers": n, "layer_types": types, "num_kv_shared_layers": shared}
        dumped = transformers.Gemma4TextConfig(**kwargs).to_dict()
        try:
            expected = hf_kv_sources(transformers.Gemma4TextConfig(**kwargs))
        except ValueError:
            with pytest.raises(ValueError, match="non-shared layer of the same type"):
                Gemma4Config.from_hf_dict(dumped)
            continue
        assert list(Gemma4Config.from_hf_dict(dumped).kv_sources) == expected
        checked += 1
    assert checked >= 20


# ---- logits ------------------------------------------------------------------------------------------------------
@torch.no_grad()
def test_full_sequence_logits_match(pair):
    hf, ours, _ = pair
    ids = prompt(hf.config.vocab_size, length=13)
    expected, got = hf(ids).logits, ours.logits(ids)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < TOL


@torch.no_grad()
def test_sliding_window_changes_the_logits(pair):
    """The sequence is longer than the window, so the window must matter: a copy with an unlimited window
    disagrees, while the real one agrees with transformers (previous test)."""
    hf, ours, path = pair
    config = json.loads((path / "config.json").read_text())
    config["sliding_window"] = 1000
    wide = Gemma4ForCausalLM(Gemma4Config.from_hf_dict(config | {"tie_word_embeddings": ours.config.tie_word_embeddings}))
    wide.load_state_dict(ours.state_dict())
    ids = prompt(hf.config.vocab_size, length=13)
    assert (wide.logits(ids) - ours.logits(ids)).abs().max() > 1e-2


@torch.no_grad()
def test_incremental_decode_logits_match(pair):
    hf, ours, _ = pair
    ids = prompt(hf.config.vocab_size, length=16, seed=2)
    prefill = 6
    expected_full = hf(ids).logits
    expected_incremental = hf_incremental_logits(hf, ids, prefill)
    got = minikv_incremental_logits(ours, ids, prefill)
    assert (got - expected_full).abs().max() < TOL
    assert (got - expected_incremental).abs().max() < TOL


@torch.no_grad()
def test_greedy_ids_equal_generate(pair):
    hf, ours, _ = pair
    ids = prompt(hf.config.vocab_size, batch=3, length=7, seed=3)
    expected = hf.generate(ids, max_new_tokens=12, do_sample=False)[:, ids.shape[1]:]
    assert ours.greedy(ids, 12).tolist() == expected.tolist()


# ---- checkpoints -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.no_grad()
def test_minikv_checkpoint_loads_in_transformers(name, tmp_path):
    hf_config = transformers.Gemma4TextConfig(**CONFIGS[name]())
    tied = hf_config.tie_word_embeddings
    torch.manual_seed(5)
    ours = Gemma4ForCausalLM(Gemma4Config.from_hf_dict(hf_config.to_dict())).eval()
    randomize_(ours, 5)
    save_checkpoint(ours, tmp_path)
    hf = transformers.Gemma4ForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == tied
    ids = prompt(ours.config.vocab_size, length=12, seed=4)
    assert (hf(ids).logits - ours.logits(ids)).abs().max() < TOL
    again = load_checkpoint(tmp_path)
    assert again.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values()))


def test_registry_loads_a_checkpoint_directory(pair, tmp_path):
    _hf, ours, _path = pair
    save_checkpoint(ours, tmp_path)
    fitting = CharTokenizer(CharTokenizer().alphabet[:ours.config.vocab_size - 3])   # no id past the vocabulary
    save_char_tokenizer(fitting, tmp_path)
    model = registry.load_model(str(tmp_path))
    assert isinstance(model, Gemma4ForCausalLM) and model.config == ours.config
    assert registry.get_tokenizer(tmp_path).encode("3 7") == CharTokenizer().encode("3 7")


def test_bad_checkpoints_fail_clearly(pair, tmp_path):
    _hf, ours, _path = pair
    save_checkpoint(ours, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"hidden_size": 2 * config["hidden_size"]}))
    with pytest.raises(CheckpointError, match="do not match config.json"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="not supported"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"enable_moe_block": True}))
    with pytest.raises(CheckpointError, match="MoE"):
        load_checkpoint(tmp_path)
    with pytest.raises(registry.ModelLoadError, match="not supported"):
        (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "llama"}))
        registry.load_model(str(tmp_path))


@torch.no_grad()
def test_multimodal_checkpoint_loads_its_text_decoder(pair, tmp_path):
    """A Gemma4ForConditionalGeneration directory (model_type "gemma4"): the text config sits in `text_config`,
    the decoder's weights under model.language_model.*, next to towers minikv ignores."""
    hf, ours, path = pair
    tensors = {f"model.language_model.{k[len('model.'):]}" if k.startswith("model.") else k: v
               for k, v in load_file(path / "model.safetensors").items()}
    tensors["model.vision_tower.patch_embedder.weight"] = torch.zeros(2, 2)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    text_config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text_config}))
    ids = prompt(hf.config.vocab_size, length=9, seed=6)
    assert torch.equal(load_checkpoint(tmp_path).logits(ids), ours.logits(ids))
