"""minikv's T5 against transformers' T5ForConditionalGeneration (transformers: dev dependency only).

Tiny random configs in float32: flan-t5's flavour (gated GELU, separate LM head, no output rescaling) and
original T5's (ReLU, tied head, output scaled by d_model**-0.5). Inputs are longer than
relative_attention_max_distance and use few buckets, so exact, logarithmic and clamped buckets all occur; one
encoder row is padded. Checked: the bucket function, full-target logits, logits of token-by-token decoding
through minikv's DenseKVCache (self K/V appended, cross K/V computed once), greedy ids against `generate`, and
checkpoint directories in both directions.
"""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the dev extra: pip install -e .[dev]")

from minikv.models import registry
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.hf_checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from minikv.models.t5 import DenseKVCache, T5Config, T5ForConditionalGeneration, relative_position_bucket
from minikv.models.tokenizer import CharTokenizer

TOL = 1e-4      # float32; see test_full_target_logits_match for what is reached

CONFIGS = {
    "flan": {"vocab_size": 40, "d_model": 32, "d_kv": 8, "d_ff": 48, "num_layers": 2, "num_heads": 4,
             "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "relative_attention_num_buckets": 8,
             "relative_attention_max_distance": 12},
    "original": {"vocab_size": 36, "d_model": 24, "d_kv": 6, "d_ff": 40, "num_layers": 3, "num_heads": 4,
                 "feed_forward_proj": "relu", "tie_word_embeddings": True, "relative_attention_num_buckets": 6,
                 "relative_attention_max_distance": 10},
}


def randomize_(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.25) + (p.dim() == 1))


def hf_model(kwargs: dict, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.T5Config(**kwargs, decoder_start_token_id=0, dropout_rate=0.0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    if kwargs["tie_word_embeddings"] is False:          # transformers 5.x ties at init; a real flan-t5 is untied
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    randomize_(model, seed)
    model.generation_config.eos_token_id = None          # generate exactly max_new_tokens
    return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """(transformers model, minikv model loaded from the directory transformers saved)."""
    hf = hf_model(CONFIGS[request.param])
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return hf, load_checkpoint(path)


def batch(vocab: int, seed: int = 1):
    """Encoder ids [2, 20] (the second row padded after 14 tokens) and decoder ids [2, 16] starting at 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (2, 20), generator=g)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 14:] = False
    ids[1, 14:] = 0
    dec = torch.randint(2, vocab, (2, 16), generator=g)
    dec[:, 0] = 0
    return ids, mask, dec


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 12), (6, 10)])
def test_relative_position_bucket_matches_transformers(bidirectional, buckets, max_distance):
    relative = torch.arange(-300, 301)[None, :] - torch.zeros(1, 1, dtype=torch.long)
    expected = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance)
    assert torch.equal(relative_position_bucket(relative, bidirectional, buckets, max_distance), expected)


def test_config_rules_match_transformers(pair):
    hf, ours = pair
    assert ours.config.scale_decoder_outputs == hf.config.scale_decoder_outputs
    assert ours.config.tie_lm_head == (hf.lm_head.weight is hf.shared.weight)
    assert ours.config.decoder_start_token_id == hf.config.decoder_start_token_id


@torch.no_grad()
def test_full_target_logits_match(pair):
    hf, ours = pair
    ids, mask, dec = batch(hf.config.vocab_size)
    expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    enc = ours.encode(ids, mask)
    assert (enc - hf.encoder(input_ids=ids, attention_mask=mask).last_hidden_state)[mask].abs().max() < TOL
    got = ours.compute_logits(ours.decode(dec, enc, mask))
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < TOL


@torch.no_grad()
def test_incremental_decode_logits_match(pair):
    hf, ours = pair
    ids, mask, dec = batch(hf.config.vocab_size, seed=2)
    expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    enc, cache = ours.encode(ids, mask), DenseKVCache()
    steps = [ours.compute_logits(ours.decode(dec[:, :5], enc, mask, cache))]      # a 5-token "prefill"
    for t in range(5, dec.shape[1]):
        steps.append(ours.compute_logits(ours.decode(dec[:, t:t + 1], enc, mask, cache)))
    assert cache.length == dec.shape[1] and len(cache.cross_kv) == ours.config.num_decoder_layers
    assert (torch.cat(steps, dim=1) - expected).abs().max() < TOL


@torch.no_grad()
def test_greedy_ids_equal_generate(pair):
    hf, ours = pair
    ids, mask, _ = batch(hf.config.vocab_size, seed=3)
    expected = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=14, do_sample=False)[:, 1:]
    assert ours.greedy(ids, 14, mask).tolist() == expected.tolist()


@pytest.mark.parametrize("name", sorted(CONFIGS))
@torch.no_grad()
def test_minikv_checkpoint_loads_in_transformers(name, tmp_path):
    kwargs = CONFIGS[name]
    tied = kwargs["tie_word_embeddings"]
    config = T5Config.from_hf_dict({**kwargs, "model_type": "t5", "decoder_start_token_id": 0}, tie_lm_head=tied)
    torch.manual_seed(5)
    ours = T5ForConditionalGeneration(config).eval()
    randomize_(ours, 5)
    save_checkpoint(ours, tmp_path)
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert (hf.lm_head.weight is hf.shared.weight) == tied
    ids, mask, dec = batch(config.vocab_size, seed=4)
    expected = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    assert (ours.compute_logits(ours.decode(dec, ours.encode(ids, mask), mask)) - expected).abs().max() < TOL
    again = load_checkpoint(tmp_path)
    assert again.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values()))


def test_registry_loads_a_checkpoint_directory(pair, tmp_path):
    ours = pair[1]
    save_checkpoint(ours, tmp_path)
    save_char_tokenizer(CharTokenizer(CharTokenizer().alphabet[:ours.config.vocab_size - 3]), tmp_path)
    model = registry.load_model(str(tmp_path))
    assert isinstance(model, T5ForConditionalGeneration) and model.config == ours.config
    assert registry.get_tokenizer(tmp_path).decode(CharTokenizer().encode("abc")) == "abc"


def test_bad_checkpoints_fail_clearly(pair, tmp_path):
    ours = pair[1]
    save_checkpoint(ours, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"d_ff": config["d_ff"] + 1}))
    with pytest.raises(CheckpointError, match="do not match config.json"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"feed_forward_proj": "gated-swish-x"}))
    with pytest.raises(CheckpointError, match="feed_forward_proj"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="neither model.safetensors"):
        load_checkpoint(tmp_path)
