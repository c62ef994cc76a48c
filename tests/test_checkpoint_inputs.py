"""Malformed checkpoint directories (the input cases the checkpoint loader owns): each is refused with an
error that names the file and says what is wrong, before anything else happens.

One small valid Gemma-4 directory and one T5 directory are written once per module; every test copies one and breaks
one file.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import minikv
from minikv.models import registry
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import Gemma4Config, Gemma4ForCausalLM
from minikv.models.hf_checkpoint import DIGEST_FILE, INDEX_FILE, save_checkpoint
from minikv.models.t5 import T5Config, T5ForConditionalGeneration
from minikv.models.tokenizer import CharTokenizer

TINY_GEMMA4 = {"model_type": "gemma4_text", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 32,
               "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
               "global_head_dim": 16, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
               "hidden_size_per_layer_input": 0, "max_position_embeddings": 64}
TINY_T5 = {"model_type": "t5", "vocab_size": 40, "d_model": 16, "d_kv": 16, "d_ff": 32, "num_layers": 1,
           "num_heads": 1, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}


@pytest.fixture(scope="module")
def valid_dirs(tmp_path_factory):
    torch.manual_seed(0)
    gemma = tmp_path_factory.mktemp("gemma")
    save_checkpoint(Gemma4ForCausalLM(Gemma4Config.from_hf_dict(TINY_GEMMA4)), gemma)
    save_char_tokenizer(CharTokenizer(), gemma)                  # 3 + 37 = 40 ids: the vocabulary exactly
    t5 = tmp_path_factory.mktemp("t5")
    save_checkpoint(T5ForConditionalGeneration(T5Config.from_hf_dict(TINY_T5, tie_lm_head=False)), t5)
    save_char_tokenizer(CharTokenizer(), t5)
    return {"gemma": gemma, "t5": t5}


@pytest.fixture
def broken(valid_dirs, tmp_path):
    """copy(kind) -> a fresh copy of the valid directory of that kind, to damage."""
    def copy(kind: str = "gemma"):
        path = tmp_path / kind
        shutil.copytree(valid_dirs[kind], path)
        return path
    return copy


def _refused(path, *fragments):
    """LLM(model=path) fails before serving anything, and the message names every fragment (the file first)."""
    with pytest.raises((registry.ModelLoadError, ValueError)) as err:
        minikv.LLM(model=str(path), backend="torch", max_num_seqs=1)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))
    return str(err.value)


def test_the_valid_directories_load_and_generate(valid_dirs):
    for kind in ("gemma", "t5"):
        llm = minikv.LLM(model=str(valid_dirs[kind]), backend="torch", max_num_seqs=1)
        assert len(llm.generate(["3 7 11"], minikv.SamplingParams(temperature=0, max_tokens=2))[0].token_ids) <= 2


def test_config_that_is_a_list(broken):
    path = broken()
    (path / "config.json").write_text(json.dumps([TINY_GEMMA4]))
    _refused(path, str(path / "config.json"), "must hold a JSON object, got a list")


def test_config_that_is_not_json(broken):
    path = broken()
    (path / "config.json").write_text("{'model_type': 'gemma4_text'")
    _refused(path, str(path / "config.json"), "is not valid JSON")


@pytest.mark.parametrize("key, value, why", [("hidden_size", "16", "a positive integer, got '16'"),
                                             ("num_attention_heads", 0, "a positive integer, got 0"),
                                             ("head_dim", 16.0, "a positive integer, got 16.0"),
                                             ("num_hidden_layers", True, "a positive integer, got True"),
                                             ("max_position_embeddings", 1, "at least 2, got 1"),
                                             ("rms_norm_eps", "1e-6", "a positive number, got '1e-6'"),
                                             ("layer_types", "sliding_attention", "must be a JSON array")])
def test_gemma4_sizes_that_are_not_positive_integers(broken, key, value, why):
    path = broken()
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {key: value}))
    _refused(path, str(path / "config.json"), key, why)


@pytest.mark.parametrize("key, value", [("d_kv", 0), ("num_heads", "1"), ("d_model", -16),
                                        ("relative_attention_num_buckets", 0)])
def test_t5_sizes_that_are_not_positive_integers(broken, key, value):
    path = broken("t5")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | {key: value}))
    _refused(path, str(path / "config.json"), key, f"must be a positive integer, got {value!r}")


def test_multimodal_wrapper_without_a_text_config(broken):
    path = broken()
    (path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": [1, 2]}))
    _refused(path, str(path / "config.json"), "text_config")


@pytest.mark.parametrize("content, why", [("{not json", "is not valid JSON"), ("[]", "got a list"),
                                          ('{"model.safetensors": 5}', "64 hex digits")])
def test_unreadable_digest_file(broken, content, why):
    path = broken()
    (path / DIGEST_FILE).write_text(content)
    _refused(path, str(path / DIGEST_FILE), why)


@pytest.mark.parametrize("content, why", [("{not json", "is not valid JSON"), ('"char"', "got a str"),
                                          ('{"type": "char"}', "non-empty alphabet"),
                                          ('{"type": "char", "alphabet": "aa"}', "repeated characters")])
def test_unreadable_minikv_tokenizer_file(broken, content, why):
    path = broken()
    (path / "minikv_tokenizer.json").write_text(content)
    _refused(path, str(path / "minikv_tokenizer.json"), why)


def _shard(path):
    """Replace model.safetensors by two shards and their index (transformers' sharded layout)."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(path / "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, str(path / file), metadata={"format": "pt"})
    (path / "model.safetensors").unlink()
    (path / DIGEST_FILE).unlink()
    index = {"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
    (path / INDEX_FILE).write_text(json.dumps(index))
    return index


def test_sharded_checkpoint_loads_and_a_broken_index_is_named(broken, valid_dirs):
    path = broken()
    index = _shard(path)
    whole = registry.load_model(str(valid_dirs["gemma"]))
    sharded = registry.load_model(str(path))
    assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), sharded.state_dict().values()))
    (path / INDEX_FILE).write_text("{")
    _refused(path, str(path / INDEX_FILE), "is not valid JSON")
    (path / INDEX_FILE).write_text(json.dumps({"metadata": {}}))
    _refused(path, str(path / INDEX_FILE), "weight_map")
    (path / INDEX_FILE).write_text(json.dumps(index))
    (path / "model-00002-of-00002.safetensors").unlink()
    _refused(path, str(path / INDEX_FILE), "model-00002-of-00002.safetensors")


def test_tokenizer_alphabet_larger_than_the_vocabulary(broken):
    path = broken()
    save_char_tokenizer(CharTokenizer(" 0123456789abcdefghijklmnopqrstuvwxyzABC"), path)    # 43 ids, vocabulary 40
    _refused(path, str(path / "minikv_tokenizer.json"), "43 token ids", "has only 40")


def test_empty_model_name_does_not_load_the_working_directory(valid_dirs, monkeypatch):
    monkeypatch.chdir(valid_dirs["gemma"])                       # a valid checkpoint right here
    for empty in ("", "  "):
        with pytest.raises(ValueError, match="empty path would load the working directory"):
            minikv.LLM(model=empty)
        with pytest.raises(registry.ModelLoadError, match="unknown model"):
            registry.load_model(empty)
        with pytest.raises(registry.ModelLoadError, match="unknown model"):
            registry.get_tokenizer(empty)
