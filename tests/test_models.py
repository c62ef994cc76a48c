"""The tiny models: shapes, the dense/engine contract of their Attention ops, loading errors, tokenizer, shipped weights."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch

from minikv.attention.context import ForwardContext, set_forward_context
from minikv.models import registry
from minikv.models.layers import dense_attention
from minikv.models.registry import ModelLoadError
from minikv.models.tokenizer import CharTokenizer

KVSHARE, ENCDEC = "tiny-kvshare", "tiny-encdec"


def fresh(name):
    torch.manual_seed(0)
    return registry.build_model(name).eval()


def positions_like(ids):
    return torch.arange(ids.shape[-1]).expand_as(ids)


# ---- shapes and structure ---------------------------------------------------------------------------------------

def test_kvshare_shapes_and_kv_sharing_structure():
    model = fresh(KVSHARE)
    cfg = model.config
    assert cfg.kv_sharing == {4: 2, 5: 3} and cfg.head_size in (16, 32, 64, 128, 256)
    assert cfg.num_heads > cfg.num_kv_heads                       # GQA
    ids = torch.randint(3, cfg.vocab_size, (2, 9))
    hidden = model(ids, positions_like(ids))
    assert hidden.shape == (2, 9, cfg.hidden_size)
    logits = model.compute_logits(hidden)
    assert logits.shape == (2, 9, cfg.vocab_size) and logits.dtype == torch.float32
    ops = model.attention_layers()
    assert [op.layer_name for op in ops] == [f"layers.{i}.self_attn" for i in range(cfg.num_layers)]
    assert [op.kv_sharing_target for op in ops] == [None] * 4 + ["layers.2.self_attn", "layers.3.self_attn"]
    assert all(op.kind == "self" for op in ops)
    for i, layer in enumerate(model.layers):                      # sharing layers own no K/V projections
        assert hasattr(layer, "k_proj") == (i not in cfg.kv_sharing)
        assert hasattr(layer, "v_proj") == (i not in cfg.kv_sharing)


def test_encdec_shapes_and_attention_layer_order():
    model = fresh(ENCDEC)
    cfg = model.config
    enc_ids = torch.randint(3, cfg.vocab_size, (2, 7))
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    enc = model.encode(enc_ids, mask)
    assert enc.shape == (2, 7, cfg.hidden_size)
    dec_ids = torch.randint(3, cfg.vocab_size, (2, 5))
    hidden = model.decode(dec_ids, positions_like(dec_ids), enc, mask)
    assert hidden.shape == (2, 5, cfg.hidden_size)
    assert model.compute_logits(hidden).dtype == torch.float32
    ops = model.attention_layers()
    n = cfg.num_layers
    assert [op.kind for op in ops] == ["self"] * n + ["cross"] * n
    assert [op.layer_name for op in ops] == [f"decoder.{i}.self_attn" for i in range(n)] + \
        [f"decoder.{i}.cross_attn" for i in range(n)]


def test_encoder_ignores_padding():
    model = fresh(ENCDEC)
    ids = torch.randint(3, 30, (1, 6))
    alone = model.encode(ids, torch.ones(1, 6, dtype=torch.bool))
    padded_ids = torch.cat([ids, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    padded = model.encode(padded_ids, torch.tensor([[True] * 6 + [False] * 3]))
    torch.testing.assert_close(padded[:, :6], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", [KVSHARE, ENCDEC])
def test_dense_forward_is_deterministic(name):
    model = fresh(name)
    ids = torch.randint(3, 30, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.bool)

    def run():
        if name == KVSHARE:
            return model.compute_logits(model(ids, positions_like(ids)))
        return model.compute_logits(model.decode(ids, positions_like(ids), model.encode(ids, mask), mask))

    assert torch.equal(run(), run())


def test_dense_mode_rejects_flat_inputs():
    model = fresh(KVSHARE)
    with pytest.raises(ValueError, match=r"dense mode takes \[B, T\]"):
        model(torch.tensor([1, 5, 6]), torch.tensor([0, 1, 2]))


# ---- engine mode: what each Attention op receives -----------------------------------------------------------------

class RecordingImpl:
    """Stands in for the engine: a per-layer 'cache' that self ops append to, cross ops fill once, and KV-sharing
    layers read from their target's entry."""

    def __init__(self, store, calls):
        self.store, self.calls = store, calls

    def forward(self, layer, q, k, v, ctx):
        self.calls.append((layer.layer_name, None if k is None else tuple(k.shape)))
        owner = layer.kv_sharing_target or layer.layer_name
        if k is not None:
            if layer.kind == "self" and owner in self.store:
                k, v = (torch.cat([old, new]) for old, new in zip(self.store[owner], (k, v)))
            self.store[owner] = (k, v)
        k, v = self.store[owner]
        every_key = torch.ones(1, k.shape[0], dtype=torch.bool)     # causal mask aligned to the last query
        return dense_attention(q[None], k[None], v[None], causal=layer.kind == "self", key_mask=every_key)[0]


def bind(model):
    store, calls = {}, []
    for op in model.attention_layers():
        op.impl = RecordingImpl(store, calls)
    return calls


def test_kvshare_engine_mode_matches_dense_and_sharing_layers_get_no_kv():
    model = fresh(KVSHARE)
    ids = torch.randint(3, 30, (1, 13))
    dense = model(ids, positions_like(ids))[0]
    calls = bind(model)
    with set_forward_context(ForwardContext(attn_metadata=None)):
        flat = model(ids[0], positions_like(ids)[0])
    torch.testing.assert_close(flat, dense, atol=1e-5, rtol=1e-5)
    cfg = model.config
    for name, kshape in calls:
        index = int(name.split(".")[1])
        assert kshape == (None if index in cfg.kv_sharing else (13, cfg.num_kv_heads, cfg.head_size))


def test_encdec_engine_context_and_decode_steps():
    model = fresh(ENCDEC)
    cfg = model.config
    enc_ids = torch.randint(3, 30, (1, 9))
    mask = torch.ones(1, 9, dtype=torch.bool)
    enc = model.encode(enc_ids, mask)
    dec_ids = torch.randint(3, 30, (1, 4))
    dense = model.decode(dec_ids, positions_like(dec_ids), enc, mask)[0]
    calls = bind(model)
    with set_forward_context(ForwardContext(attn_metadata=None)):
        # context step: the encoder output is projected and handed to the cross ops
        first = model.decode(dec_ids[0, :3], torch.arange(3), encoder_out=enc[0])
        kv_shape = (cfg.num_kv_heads, cfg.head_size)
        assert [k for name, k in calls if "self" in name] == [(3, *kv_shape)] * cfg.num_layers
        assert [k for name, k in calls if "cross" in name] == [(9, *kv_shape)] * cfg.num_layers
        calls.clear()
        # decode step: cross ops get k = v = None and read what the context step stored
        step = model.decode(dec_ids[0, 3:], torch.tensor([3]), encoder_out=None)
    assert [k is None for name, k in calls if "self" in name] == [False] * cfg.num_layers
    assert [k is None for name, k in calls if "cross" in name] == [True] * cfg.num_layers
    torch.testing.assert_close(first, dense[:3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step, dense[3:], atol=1e-5, rtol=1e-5)


def test_engine_mode_without_bound_impl_is_a_clear_error():
    model = fresh(KVSHARE)
    with set_forward_context(ForwardContext(attn_metadata=None)), \
            pytest.raises(RuntimeError, match="no attention impl bound"):
        model(torch.tensor([1, 5]), torch.tensor([0, 1]))


# ---- loading ---------------------------------------------------------------------------------------------------

def test_unknown_model_lists_known_ones():
    with pytest.raises(ModelLoadError, match="tiny-kvshare, tiny-encdec"):
        registry.load_model("tiny-gpt")
    assert issubclass(ModelLoadError, RuntimeError)
    with pytest.raises(ModelLoadError):
        registry.model_config("nope")
    with pytest.raises(ModelLoadError):
        registry.get_tokenizer("nope")


@pytest.mark.parametrize("name", [KVSHARE, ENCDEC])
def test_load_model_defaults(name):
    model = registry.load_model(name)
    want = torch.float32 if name == KVSHARE else torch.float16
    assert all(p.dtype == want for p in model.parameters())
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert model.config == registry.model_config(name)
    assert registry.default_dtype(name, "cuda") == (torch.bfloat16 if name == KVSHARE else torch.float16)
    assert registry.load_model(name, dtype="bfloat16").embed.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be"):
        registry.load_model(name, dtype=torch.int8)


def test_missing_weights_file(tmp_path):
    with pytest.raises(ModelLoadError, match="missing.*minikv train tiny-kvshare"):
        registry.load_model(KVSHARE, weights_dir=tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "bad_header", "flipped_data", "empty"])
def test_damaged_weights_file(tmp_path, damage):
    data = bytearray(registry.weights_path(ENCDEC).read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "bad_header":
        data[10:20] = b"\xff" * 10
    elif damage == "flipped_data":
        data[-100] ^= 0x40
    else:
        data = bytearray()
    registry.weights_path(ENCDEC, tmp_path).write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="truncated or corrupted|corrupted"):
        registry.load_model(ENCDEC, weights_dir=tmp_path)


def test_weights_that_do_not_match_the_config(tmp_path, monkeypatch):
    from dataclasses import replace
    wrong = replace(registry.model_config(KVSHARE), intermediate_size=64)
    monkeypatch.setitem(registry._CONFIGS, KVSHARE, wrong)
    registry.save_weights(registry.build_model(KVSHARE), tmp_path)
    monkeypatch.undo()
    with pytest.raises(ModelLoadError, match=r"does not match its config.*mlp.*shape"):
        registry.load_model(KVSHARE, weights_dir=tmp_path)


def test_shipped_weights_are_small_and_their_json_matches_the_config():
    assert all(registry.weights_path(n).stat().st_size <= 5 * 1024 * 1024 for n in registry.MODEL_NAMES)
    for name in (KVSHARE, ENCDEC):            # tiny-gemma4 / tiny-t5: tests/test_trained_models.py
        record = json.loads(registry.weights_path(name).with_suffix(".json").read_text())
        config = asdict(registry.model_config(name))
        config["kv_sharing"] = {str(k): v for k, v in config["kv_sharing"].items()}   # JSON keys are strings
        assert record["config"] == config


# ---- tokenizer ---------------------------------------------------------------------------------------------------

def test_tokenizer_round_trip_and_specials():
    tok = registry.get_tokenizer(KVSHARE)
    assert isinstance(tok, CharTokenizer)
    assert len({tok.pad_id, tok.bos_id, tok.eos_id}) == 3
    text = "3 7 11 15 abc xyz 0"
    ids = tok.encode(text)
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert all(tok.eos_id < i < tok.vocab_size for i in ids)
    assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == text
    assert registry.model_config(KVSHARE).vocab_size == tok.vocab_size


def test_tokenizer_errors():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match="'A' is not in the tokenizer's alphabet"):
        tok.encode("12A")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([tok.vocab_size])
    with pytest.raises(TypeError):
        tok.encode(123)


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread is about as fast, and far faster than two on a busy shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("name", [KVSHARE, ENCDEC])
def test_shipped_weights_solve_their_task(name, one_thread):
    """A quick look (the full 200-prompt matrix is in the JSON): fp8 with scale 1.0 is the hardest format."""
    from minikv.models.train import evaluate_dense
    result = evaluate_dense(name, n=24, kv_fake_quant="fp8", seed=11)
    assert result["exact_match"] >= 0.95, result["failures"]
