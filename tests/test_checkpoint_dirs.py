"""Bring your own checkpoint: a transformers-format directory of Gemma-4 (text) or T5 with its own tokenizer.json
(a byte-level BPE, through the `tokenizers` library) and bf16 safetensors, sharded or not, runs through
`LLM(model=DIR)` with transformers' greedy ids, and both reproductions run on it. The directories are written by
transformers itself (tools/random_checkpoints.py, random weights, no download)."""
from __future__ import annotations

import json

import pytest
import torch

import minikv
from minikv.models import registry
from minikv.models.dir_tokenizer import HFTokenizer
from minikv.repro import cross_stride, scale_wipe

transformers = pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")
from tools import random_checkpoints

PROMPTS = ["3 7 11 15", "250 263 276 289", "10 20 30"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {"gemma4": random_checkpoints.write("gemma4", tmp_path_factory.mktemp("gemma4"), shard="100KB",
                                              randomize=True),
           "t5": random_checkpoints.write("t5", tmp_path_factory.mktemp("t5"), randomize=True)}
    yield out
    torch.set_num_threads(threads)


def test_directories_look_like_real_checkpoints(dirs):
    files = {p.name for p in dirs["gemma4"].iterdir()}
    assert {"config.json", "tokenizer.json", "model.safetensors.index.json"} <= files and len(
        [f for f in files if f.endswith(".safetensors")]) == 2
    assert json.loads((dirs["gemma4"] / "config.json").read_text())["dtype"] == "bfloat16"
    tok = registry.get_tokenizer(dirs["gemma4"])
    assert isinstance(tok, HFTokenizer) and (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert all(tok.decode(tok.encode(p)) == p for p in PROMPTS)
    assert len(tok.encode("250 263 276 289")) < len("250 263 276 289")       # a BPE: numbers merge into tokens
    task = minikv.tasks.for_checkpoint(tok)
    assert task.check("3 7 11 15", " 19 23 2") and task.check("3 7 11 15", ", 19, 23") and \
        not task.check("3 7 11 15", " 19 24") and not task.check("3 7 11 15", "the 19")


@pytest.mark.parametrize("kind", ["gemma4", "t5"])
@torch.no_grad()
def test_engine_matches_transformers(dirs, kind):
    path = dirs[kind]
    hf_class = transformers.Gemma4ForCausalLM if kind == "gemma4" else transformers.T5ForConditionalGeneration
    hf = hf_class.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    llm = minikv.LLM(model=str(path), backend="torch", max_num_seqs=3)
    outs = llm.generate(PROMPTS, minikv.SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    tok = llm.tokenizer
    for prompt, out in zip(PROMPTS, outs):
        if kind == "gemma4":
            ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
            expected = hf.generate(ids, max_new_tokens=5, do_sample=False)[0, ids.shape[1]:]
        else:
            expected = hf.generate(torch.tensor([tok.encode(prompt)]), max_new_tokens=5, do_sample=False)[0, 1:]
        assert out.token_ids == expected.tolist(), prompt


def test_scale_wipe_repro_runs_on_a_checkpoint_directory(dirs, capsys):
    code = scale_wipe.main(["--model", str(dirs["gemma4"]), "--max-num-seqs", "2", "--requests", "4",
                            "--max-tokens", "3", "--formats", "int8_per_token_head", "--skip-extras"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "token ids other than the fixed engine's" in out and "0-1" in out


def test_cross_stride_thresholds_on_a_t5_directory(dirs):
    model = str(dirs["t5"])
    prompts = cross_stride.make_prompts(3, model=model)
    need = cross_stride.engine("fp8", backend="torch", model=model).cross_blocks_needed(prompts)
    buggy_ref, fixed_ref, _ = cross_stride.references(prompts, need, backend="torch", model=model)
    outcome = {(f, b, s): cross_stride.run_pool(prompts, buggy_ref if b else fixed_ref, f, need, b, s,
                                                backend="torch", model=model).outcome
               for f, b, s in [(1.5, True, True), (2.0, True, True), (2.0, True, False), (1.5, False, True)]}
    assert outcome == {(1.5, True, True): "overrun caught", (2.0, True, True): "correct",
                       (2.0, True, False): "correct", (1.5, False, True): "correct"}
    assert "mismatch" in cross_stride.bind_time_check(model=model)
