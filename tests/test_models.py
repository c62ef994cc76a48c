"""The shipped models' structure as the engine sees it, their loading errors, and the tokenizer.

Parity with transformers is in tests/test_parity_*.py and tests/test_trained_models.py (which also checks the
checkpoint directories and the tasks' domains); this file checks what the engine relies on.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from minikv.attention.context import ForwardContext
from minikv.models import hf_checkpoint, registry
from minikv.models.registry import ModelLoadError
from minikv.models.tokenizer import CharTokenizer

GEMMA4, T5 = "tiny-gemma4", "tiny-t5"


def fresh(name):
    torch.manual_seed(0)
    return registry.build_model(name).eval()


# ---- structure ------------------------------------------------------------------------------------------------------

def test_gemma4_attention_layers_and_kv_sharing_targets():
    model = fresh(GEMMA4)
    cfg = model.config
    ops = model.attention_layers()
    assert [op.layer_name for op in ops] == [f"model.layers.{i}.self_attn" for i in range(cfg.num_layers)]
    assert all(op.kind == "self" for op in ops) and cfg.num_heads > cfg.num_kv_heads        # GQA
    # 4 and 6 read layer 2's sliding cache, 5 and 7 layer 3's full cache: two sharers per source
    assert [op.kv_sharing_target for op in ops] == [None] * 4 + [f"model.layers.{i}.self_attn" for i in (2, 3, 2, 3)]
    assert cfg.kv_sharing == {4: 2, 5: 3, 6: 2, 7: 3}
    for i, layer in enumerate(model.model.layers):                 # sharing layers own no K/V projections
        assert hasattr(layer.self_attn, "k_proj") == (i not in cfg.kv_sharing)
        assert hasattr(layer.self_attn, "v_proj") == (i not in cfg.kv_sharing)
    ids = torch.randint(3, cfg.vocab_size, (2, 9))
    logits = model.compute_logits(model(ids))
    assert logits.shape == (2, 9, cfg.vocab_size) and logits.dtype == torch.float32


def test_t5_attention_layers_are_self_then_cross():
    model = fresh(T5)
    ops = model.attention_layers()
    n = model.config.num_decoder_layers
    assert [op.kind for op in ops] == ["self"] * n + ["cross"] * n
    assert [op.layer_name for op in ops] == [f"decoder.{i}.self_attn" for i in range(n)] + \
        [f"decoder.{i}.cross_attn" for i in range(n)]
    assert all(op.kv_sharing_target is None for op in ops)


def test_t5_encoder_ignores_padding():
    model = fresh(T5)
    ids = torch.randint(3, 30, (1, 6))
    alone = model.encode(ids, torch.ones(1, 6, dtype=torch.bool))
    padded_ids = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    padded = model.encode(padded_ids, torch.tensor([[True] * 6 + [False] * 3]))
    torch.testing.assert_close(padded[:, :6], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [GEMMA4, T5])
def test_dense_forward_is_deterministic(name):
    model = fresh(name)
    ids = torch.randint(3, 14, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.bool)

    def run():
        if name == GEMMA4:
            return model.compute_logits(model(ids))
        return model.compute_logits(model.decode(ids, model.encode(ids, mask), mask))

    assert torch.equal(run(), run())


def test_dense_mode_rejects_flat_inputs():
    with pytest.raises(ValueError, match=r"\[batch, tokens\]"):
        fresh(GEMMA4)(torch.tensor([1, 5, 6]))
    with pytest.raises(ValueError, match=r"\[batch, tokens\]"):
        fresh(T5).encode(torch.tensor([5, 6, 7]))


def test_engine_mode_without_bound_impl_is_a_clear_error():
    model = fresh(GEMMA4)
    with pytest.raises(RuntimeError, match="model.layers.0.self_attn: no attention impl bound"):
        model(torch.tensor([1, 5]), torch.tensor([0, 1]), ctx=ForwardContext(attn_metadata=None, bindings={}))


# ---- loading -----------------------------------------------------------------------------------------------------

def test_unknown_model_lists_known_ones():
    with pytest.raises(ModelLoadError, match="known models: tiny-gemma4, tiny-t5"):
        registry.load_model("tiny-gpt")
    assert registry.MODEL_NAMES == (GEMMA4, T5, "tiny-gemma4-e2b")
    assert registry.TRAINED_MODELS == (GEMMA4, T5)
    assert issubclass(ModelLoadError, RuntimeError)
    with pytest.raises(ModelLoadError):
        registry.model_config("nope")
    with pytest.raises(ModelLoadError):
        registry.get_tokenizer("nope")


@pytest.mark.parametrize("name", [GEMMA4, T5])
def test_load_model_defaults(name):
    model = registry.load_model(name)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert model.config == registry.model_config(name)
    assert registry.default_dtype(name, "cuda") == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in registry.load_model(name, dtype="bfloat16").parameters())
    with pytest.raises(ValueError, match="dtype must be"):
        registry.load_model(name, dtype="int8")


def test_missing_checkpoint_directory_says_how_to_rebuild(tmp_path):
    with pytest.raises(ModelLoadError, match="missing.*minikv train tiny-gemma4"):
        registry.load_model(GEMMA4, weights_dir=tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "bad_header", "empty"])
def test_damaged_weights_file(tmp_path, damage):
    shutil.copytree(registry.checkpoint_dir(T5), tmp_path / T5)
    path = registry.weights_path(T5, tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "bad_header":
        data[10:20] = b"\xff" * 10
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="truncated|corrupt|safetensors|header"):
        registry.load_model(T5, weights_dir=tmp_path)


def test_weights_that_do_not_match_the_config(tmp_path):
    shutil.copytree(registry.checkpoint_dir(GEMMA4), tmp_path / GEMMA4)
    config_file = tmp_path / GEMMA4 / hf_checkpoint.CONFIG_FILE
    config = json.loads(config_file.read_text())
    config["intermediate_size"] = 64
    config_file.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"shape"):
        registry.load_model(GEMMA4, weights_dir=tmp_path)


# ---- tokenizer ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text", [(GEMMA4, "3 7 11 15 0"), (T5, "banana42xyz0")])
def test_tokenizer_round_trip_and_specials(name, text):
    tok = registry.get_tokenizer(name)
    assert isinstance(tok, CharTokenizer)
    assert len({tok.pad_id, tok.bos_id, tok.eos_id}) == 3
    ids = tok.encode(text)
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert all(tok.eos_id < i < tok.vocab_size for i in ids)
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == text
    assert registry.model_config(name).vocab_size == tok.vocab_size


def test_tokenizer_errors():
    tok = registry.get_tokenizer(GEMMA4)
    with pytest.raises(ValueError, match="'a' is not in the tokenizer's alphabet"):
        tok.encode("12a")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(TypeError):
        tok.encode(123)
    with pytest.raises(ValueError, match="repeated"):
        CharTokenizer("aa")
