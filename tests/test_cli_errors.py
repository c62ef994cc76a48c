"""Every error the `minikv` command meets ends as one line, `minikv: error: ...`, and its documented status (2 bad
input, 1 a found defect or failed check, 3 an engine fault), never a traceback unless asked for (`--traceback`,
MINIKV_TRACEBACK=1). The bad checkpoints are those a new user meets: each one is a valid directory with one thing
broken. Runs `minikv.cli.main` in-process (a subprocess costs seconds of imports)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

import minikv
from minikv.cache.arena import KVCacheOverrunError
from minikv.cache.layout import KVLayoutMismatchError
from minikv.cli import main
from minikv.engine.errors import ConcurrentUseError, EngineNeedsResetError
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import Gemma4Config, Gemma4ConfigError, Gemma4ForCausalLM
from minikv.models.hf_checkpoint import INDEX_FILE, CheckpointError, save_checkpoint
from minikv.models.registry import ModelLoadError
from minikv.models.t5 import T5ConfigError
from minikv.models.tokenizer import CharTokenizer

TINY = {"model_type": "gemma4_text", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "global_head_dim": 16, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
        "hidden_size_per_layer_input": 0, "max_position_embeddings": 64}


def _config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(config | changes))


def _no_tokenizer(path):
    for name in ("minikv_tokenizer.json", "tokenizer.json", "tokenizer_config.json"):
        (path / name).unlink(missing_ok=True)


def _truncated(path):
    file = sorted(path.glob("*.safetensors"))[0]
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def _broken_index(path):
    """A shard index naming a shard that is not there (a sharded directory loses a shard; a single-file one gets
    an index in place of its weights)."""
    if (path / INDEX_FILE).exists():
        sorted(path.glob("model-*.safetensors"))[-1].unlink()
        return
    (path / "model.safetensors").unlink()
    (path / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.embed_tokens.weight":
                                                              "model-00001-of-00002.safetensors"}}))


def _bad_json(path):
    (path / "config.json").write_text("{'model_type': 'gemma4_text'")


# (case, how to break the valid directory, a fragment the one line must hold)
BAD_CHECKPOINTS = [
    ("no tokenizer", _no_tokenizer, "has no tokenizer"),
    ("model_type llama", lambda p: _config(p, model_type="llama"), "model_type 'llama' is not supported"),
    ("model_type gpt2", lambda p: _config(p, model_type="gpt2"), "model_type 'gpt2' is not supported"),
    ("truncated safetensors", _truncated, ".safetensors"),
    ("negative num_hidden_layers", lambda p: _config(p, num_hidden_layers=-2),
     "num_hidden_layers must be a positive integer, got -2"),
    ("heads that do not divide", lambda p: _config(p, num_attention_heads=3, num_key_value_heads=2),
     "3 query heads are not a multiple of 2 KV heads"),
    ("broken shard index", _broken_index, "names shard(s) that are not in"),
    ("bad JSON", _bad_json, "is not valid JSON"),
    ("no config.json", lambda p: (p / "config.json").unlink(), "has no config.json"),
]


@pytest.fixture(scope="module")
def valid_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("valid")
    save_checkpoint(Gemma4ForCausalLM(Gemma4Config.from_hf_dict(TINY)), path)
    save_char_tokenizer(CharTokenizer(), path)
    return path


def _one_line(capsys, argv, status):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == status, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("minikv: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("case, damage, fragment", BAD_CHECKPOINTS, ids=[c[0] for c in BAD_CHECKPOINTS])
def test_a_bad_checkpoint_is_one_line_and_status_2(valid_dir, tmp_path, capsys, case, damage, fragment):
    path = shutil.copytree(valid_dir, tmp_path / "checkpoint")
    damage(path)
    err = _one_line(capsys, ["generate", "--backend", "torch", "--model", str(path), "3 7"], 2)
    assert fragment in err and str(path) in err, err


def test_the_valid_directory_generates(valid_dir, capsys):
    assert main(["generate", "--backend", "torch", "--model", str(valid_dir), "--max-tokens", "2", "3 7"]) == 0
    assert capsys.readouterr().out.startswith("'3 7' -> ")


def test_hints_say_what_to_do(valid_dir, tmp_path, capsys):
    path = shutil.copytree(valid_dir, tmp_path / "checkpoint")
    _no_tokenizer(path)
    assert "(hint: " in _one_line(capsys, ["generate", "--model", str(path), "3 7"], 2)


def test_error_classes_share_one_base_and_keep_their_own():
    for cls, base, status in [(ModelLoadError, RuntimeError, 2), (CheckpointError, RuntimeError, 2),
                              (Gemma4ConfigError, ValueError, 2), (T5ConfigError, ValueError, 2),
                              (KVCacheOverrunError, RuntimeError, 1), (KVLayoutMismatchError, RuntimeError, 1),
                              (ConcurrentUseError, RuntimeError, 3), (EngineNeedsResetError, RuntimeError, 3)]:
        assert issubclass(cls, minikv.MinikvError) and issubclass(cls, base) and cls.exit_status == status, cls


@pytest.mark.parametrize("error, status", [(KVCacheOverrunError("k0", 10, 20, 12, 3), 1),
                                           (EngineNeedsResetError("the arena was overrun"), 3),
                                           (RuntimeError("an unforeseen fault"), 3),
                                           (KeyError("x"), 3)])
def test_status_follows_the_kind_of_error(monkeypatch, capsys, error, status):
    from minikv import cli

    def fail(args):
        raise error
    monkeypatch.setattr(cli, "_cmd_bugs", fail)
    err = _one_line(capsys, ["bugs"], status)
    if status == 3 and not isinstance(error, minikv.MinikvError):
        assert "internal error" in err and "--traceback" in err


@pytest.mark.parametrize("how", ["option", "option after the subcommand", "environment"])
def test_traceback_on_request(valid_dir, tmp_path, capsys, monkeypatch, how):
    path = shutil.copytree(valid_dir, tmp_path / "checkpoint")
    _config(path, model_type="llama")
    argv = ["generate", "--model", str(path), "3 7"]
    if how == "option":
        argv = ["--traceback", *argv]
    elif how == "option after the subcommand":
        argv = [*argv, "--traceback"]
    else:
        monkeypatch.setenv("MINIKV_TRACEBACK", "1")
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1].startswith("minikv: error: ")


def test_a_prompt_of_unknown_tokens_only_is_refused(valid_dir, tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    path = shutil.copytree(valid_dir, tmp_path / "checkpoint")
    (path / "minikv_tokenizer.json").unlink()
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "[UNK]": 3, "hello": 4, "world": 5}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    _config(path, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    err = _one_line(capsys, ["generate", "--backend", "torch", "--model", str(path), "bonjour"], 2)
    assert "encodes to the unknown token '[UNK]' only" in err
    assert main(["generate", "--backend", "torch", "--model", str(path), "--max-tokens", "1", "hello"]) == 0


def test_repro_without_a_defect_lists_them(capsys):
    assert main(["repro"]) == 0
    out = capsys.readouterr().out
    assert "scale-wipe" in out and "cross-stride" in out and "required" not in out and "rest" not in out
    assert "decoder-only model with KV-sharing layers" in out and "encoder-decoder model" in out
