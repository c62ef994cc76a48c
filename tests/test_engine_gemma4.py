"""Gemma-4 through minikv's paged engine (torch backend) against transformers' `generate`.

Only what the kernels support today: one head size and KV-head count for all layers, and a sliding window that
covers the whole context (so sliding layers attend like full ones). KV sharing is E2B-shaped (several sharing
layers per source cache). LLM() takes registered model names only, so the test registers the checkpoint
directory's path as a name; accepting a directory is a one-line change in minikv/engine/llm.py.
"""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the parity tests need the dev extra: pip install -e .[dev]")

import minikv
from minikv.models import registry
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import FULL, SLIDING, Gemma4ConfigError
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
    monkeypatch.setattr(registry, "MODEL_NAMES", (*registry.MODEL_NAMES, str(tmp_path)))
    return hf


@torch.no_grad()
def test_engine_greedy_equals_transformers_generate(tmp_path, monkeypatch):
    hf = checkpoint(tmp_path, monkeypatch)
    llm = minikv.LLM(model=str(tmp_path), backend="torch", max_num_seqs=4, block_size=8)
    assert sum(1 for a in llm.attention_layers.values() if a.kv_sharing_target is not None) == 6
    outs = llm.generate(PROMPTS, minikv.SamplingParams(max_tokens=10, ignore_eos=True))
    tok = CharTokenizer()
    for prompt, out in zip(PROMPTS, outs):
        ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
        expected = hf.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist()
        assert out.token_ids == expected, prompt


def test_engine_refuses_a_window_shorter_than_the_context(tmp_path, monkeypatch):
    checkpoint(tmp_path, monkeypatch, sliding_window=8)
    with pytest.raises(Gemma4ConfigError, match="sliding window yet"):
        minikv.LLM(model=str(tmp_path), backend="torch")
