"""Gemma-4 through minikv's paged engine (torch backend) against transformers' `generate`.

One head size and KV-head count for all layers here (per-layer shapes: tests/test_engine_perlayer.py); sliding
windows both covering the context and much shorter than it. KV sharing is E2B-shaped (several sharing layers per
source cache). The engine loads the random checkpoint from its directory: `LLM(model=PATH)`.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the dev extra: pip install -e .[dev]")

import minikv
from minikv.models import registry
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import FULL, SLIDING
from minikv.models.tokenizer import CharTokenizer

S, F = SLIDING, FULL
PROMPTS = ["3 7 11 15", "10 20 30", "5", "123 456 789 1011 1213"]


def engine_ready_config(**overrides) -> dict:
    return {
        "vocab_size": CharTokenizer().vocab_size, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 10, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "global_head_dim": 16, "layer_types": [S, S, F, S, S, F, S, S, F, F], "sliding_window": 64,
        "max_position_embeddings": 64, "num_kv_shared_layers": 6, "hidden_size_per_layer_input": 8,
        "vocab_size_per_layer_input": CharTokenizer().vocab_size, "final_logit_softcapping": 30.0,
        **overrides,
    }


def checkpoint(tmp_path, monkeypatch, **overrides):
    torch.manual_seed(0)
    hf = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**engine_ready_config(**overrides))).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.25) + (p.dim() == 1))
    hf.generation_config.eos_token_id = None
    hf.save_pretrained(tmp_path)
    save_char_tokenizer(CharTokenizer(), tmp_path)
    return hf


@torch.no_grad()
def test_engine_greedy_equals_transformers_generate(tmp_path, monkeypatch):
    hf = checkpoint(tmp_path, monkeypatch)
    llm = minikv.LLM(model=str(tmp_path), backend="torch", max_num_seqs=4, block_size=8)
    assert sum(1 for a in llm.attention_layers.values() if a.kv_sharing_target is not None) == 6
    outs = llm.generate(PROMPTS, minikv.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    tok = CharTokenizer()
    for prompt, out in zip(PROMPTS, outs):
        ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
        expected = hf.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist()
        assert out.token_ids == expected, prompt


WINDOW_PROMPTS = ["123 456 789 1011 1213", "3 7 11 15 19 23", "5"]


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    """A checkpoint whose sliding window (6) is much shorter than the prompts plus their continuations, and the
    ids transformers generates with it; a second model with the same weights and an unlimited window must
    generate other ids, or the window would not be tested."""
    path = tmp_path_factory.mktemp("gemma4_window")
    with pytest.MonkeyPatch.context() as mp:
        hf = checkpoint(path, mp, sliding_window=6)
    full = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**engine_ready_config())).eval()
    full.load_state_dict(hf.state_dict())
    tok = CharTokenizer()
    expected, unwindowed = [], []
    with torch.no_grad():
        for prompt in WINDOW_PROMPTS:
            ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
            expected.append(hf.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist())
            unwindowed.append(full.generate(ids, max_new_tokens=10, do_sample=False,
                                            eos_token_id=None)[0, ids.shape[1]:].tolist())
    assert expected != unwindowed
    return path, expected


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8_per_token_head"])
@torch.no_grad()
def test_engine_with_a_window_shorter_than_the_context(windowed, monkeypatch, backend, kv_cache_dtype):
    """Sliding layers (and the layers sharing their caches) see the last 6 positions, in prefill and decode."""
    path, expected = windowed
    llm = minikv.LLM(model=str(path), backend=backend, kv_cache_dtype=kv_cache_dtype, max_num_seqs=4, block_size=8)
    windows = {a.impl.sliding_window for a in llm.attention_layers.values()}
    assert windows == {0, 6}
    outs = llm.generate(WINDOW_PROMPTS, minikv.SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert [o.token_ids for o in outs] == expected


def test_llm_takes_a_checkpoint_directory_path(tmp_path):
    """A str or a pathlib.Path; a missing directory, or one without config.json, is refused before loading."""
    checkpoint(tmp_path, None)
    for model in (tmp_path, str(tmp_path)):
        llm = minikv.LLM(model=model, backend="torch", max_num_seqs=2)
        assert llm.model_name == str(tmp_path) and llm.task is None      # a user's checkpoint: prompts unchecked
        assert len(llm.generate(["12 3"], minikv.SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0].token_ids) == 3
    with pytest.raises(ValueError, match="neither a shipped model"):
        minikv.LLM(model=str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        minikv.LLM(model=tmp_path / "empty")
    with pytest.raises(ValueError, match="unknown model"):
        minikv.LLM(model="tiny-gemma5")
