"""Bring your own checkpoint: a transformers-format directory of Gemma-4 (text) or T5 with its own tokenizer.json
(a byte-level BPE, through the `tokenizers` library) and bf16 safetensors, sharded or not, runs through
`LLM(model=DIR)` with transformers' greedy ids. Then a new user's walk through the command line: `generate`
(text and --ids), both reproductions, each on the wrong kind of model too, `hunt --model` (clean on the fixed
engine, each defect the architecture has found, its reproduction failing visibly as printed, --results and --plot)
and every bad checkpoint, each error one line with status 2. The directories are written by transformers itself
(tools/random_checkpoints.py, random weights, no download)."""
from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest
import torch

import minikv
from minikv import cli
from minikv.models import registry
from minikv.models.dir_tokenizer import HFTokenizer

transformers = pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")
from test_cli_errors import BAD_CHECKPOINTS  # noqa: E402  (the bad inputs every checkpoint is tried with)
from tools import random_checkpoints  # noqa: E402

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
    outs = llm.generate(PROMPTS, minikv.SamplingParams(temperature=0, max_tokens=5, ignore_eos=True), use_tqdm=False)
    tok = llm.tokenizer
    for prompt, out in zip(PROMPTS, outs):
        if kind == "gemma4":
            ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
            expected = hf.generate(ids, max_new_tokens=5, do_sample=False)[0, ids.shape[1]:]
        else:
            expected = hf.generate(torch.tensor([tok.encode(prompt)]), max_new_tokens=5, do_sample=False)[0, 1:]
        assert out.token_ids == expected.tolist(), prompt


# ---- a new user's walk, through the command line ------------------------------------------------------------------
# In-process (`minikv.cli.main`): a subprocess would cost seconds of imports per command. Exit statuses: 0 clean or
# reproduced, 1 a finding, 2 bad input (one line on stderr).

def _main(argv) -> int:
    try:
        return cli.main(argv)
    except SystemExit as done:
        return done.code


def test_walk_generate(dirs, capsys):
    for kind in ("gemma4", "t5"):
        assert _main(["generate", "--model", str(dirs[kind]), "--backend", "torch", "--max-tokens", "3",
                      "--temperature", "0", *PROMPTS[:2]]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert [line.split(" -> ")[0] for line in lines] == [repr(p) for p in PROMPTS[:2]]
        assert _main(["generate", "--model", str(dirs[kind]), "--backend", "torch", "--max-tokens", "3", "--ids",
                      "--temperature", "0", PROMPTS[0]]) == 0
        shown = capsys.readouterr().out
        ids = registry.get_tokenizer(dirs[kind]).encode(PROMPTS[0])
        assert shown.startswith(f"{PROMPTS[0]!r} {ids} -> [") and shown.rstrip().endswith("[length]"), shown


def test_walk_both_reproductions(dirs, capsys):
    assert _main(["repro", "scale-wipe", "--model", str(dirs["gemma4"]), "--max-num-seqs", "2", "--requests", "4",
                  "--max-tokens", "3", "--formats", "int8_per_token_head", "--skip-extras"]) == 0
    out = capsys.readouterr().out
    assert "token ids other than the fixed engine's" in out and "0-1" in out
    assert _main(["repro", "cross-stride", "--model", str(dirs["t5"]), "--backend", "torch", "--requests", "4"]) == 0
    assert "All signatures reproduced" in capsys.readouterr().out


@pytest.mark.parametrize("command, kind, needs", [("scale-wipe", "t5", "decoder-only model with KV-sharing layers"),
                                                  ("cross-stride", "gemma4", "encoder-decoder model")])
def test_walk_a_reproduction_on_the_wrong_kind_of_model(dirs, capsys, command, kind, needs):
    assert _main(["repro", command, "--model", str(dirs[kind])]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needs in err and "Traceback" not in err, err


def _run_snippet(code: str) -> tuple[int, str]:
    out = io.StringIO()
    status = 0
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, "<reproduction>", "exec"), {})
        except SystemExit as done:
            status = done.code
    return status, out.getvalue()


# (checkpoint, defect or None, scenarios at most): the fixed engine comes out clean, and each defect the
# architecture has is found.
WALK_HUNTS = [("gemma4", None, 16), ("gemma4", "scale-wipe", 40), ("t5", None, 16), ("t5", "cross-stride", 24),
              ("t5", "cross-fp8-context-read", 24)]


@pytest.mark.parametrize("kind, defect, scenarios", WALK_HUNTS, ids=[f"{k}-{d or 'fixed'}" for k, d, _ in WALK_HUNTS])
def test_walk_hunt_on_the_checkpoint(dirs, capsys, tmp_path, monkeypatch, kind, defect, scenarios):
    monkeypatch.chdir(tmp_path)
    argv = ["hunt", "--model", str(dirs[kind]), "--max-scenarios", str(scenarios), "--results", "hunt.json"]
    if defect:
        argv += ["--reintroduce", defect]
    status = _main(argv)
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "hunt.json").read_text())
    assert data["cells"] and all(c.startswith(dirs[kind].name + " x ") for c in data["cells"])
    if defect is None:
        assert status == 0 and out.startswith(f"clean: {scenarios} scenarios"), out
        assert data["outcome"] == "clean" and data["refused"] == 0 and len(data["scenarios"]) == scenarios
        return
    assert status == 1 and out.startswith("FOUND in cell "), out
    finding = data["finding"]
    assert finding["reproduction"] in out and finding["shrunk_scenario"]["model"] == str(dirs[kind])
    code, shown = _run_snippet(finding["reproduction"])                  # run as printed: it fails visibly
    assert code == 1 and "expected" in shown and "seen" in shown, shown
    fixed, shown = _run_snippet(finding["reproduction"].replace(f"reintroduce=({defect!r},)", "reintroduce=()"))
    assert fixed == 0, shown


def test_walk_hunt_saves_its_search_map(dirs, capsys, tmp_path):
    assert _main(["hunt", "--model", str(dirs["t5"]), "--reintroduce", "cross-stride", "--max-scenarios", "24",
                  "--plot", str(tmp_path / "map.png")]) == 1
    assert (tmp_path / "map.png").stat().st_size > 10_000
    assert f"search map written to {tmp_path / 'map.png'}" in capsys.readouterr().out


@pytest.mark.parametrize("case, damage, fragment", BAD_CHECKPOINTS, ids=[c[0] for c in BAD_CHECKPOINTS])
def test_walk_bad_checkpoints_are_one_line(dirs, tmp_path, capsys, case, damage, fragment):
    path = shutil.copytree(dirs["gemma4"], tmp_path / "checkpoint")
    damage(path)
    for argv in (["generate", "--model", str(path), "3 7"], ["hunt", "--model", str(path)],
                 ["repro", "scale-wipe", "--model", str(path)]):
        assert _main(argv) == 2, argv
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("minikv: error: "), err
        assert fragment in err and "Traceback" not in err, (argv, err)


def test_prefix_sharing_prompt_sets_on_a_decoder_only_checkpoint(dirs):
    """A decoder-only checkpoint's prompts are free, so the hunter also draws sets whose tokens (BOS + the prompt, as
    the engine's prefix cache sees them) share exactly a prefix ending inside a block, at a block boundary, or
    several blocks in; each prompt round-trips token for token."""
    from minikv.hunt import strategies
    model = str(dirs["gemma4"].resolve())
    tok = registry.get_tokenizer(model)
    assert strategies.prefix_lengths(model, 16) == [15, 16, 17, 32, 33, 47]
    for shared in strategies.prefix_lengths(model, 16):
        prompts = strategies.shared_prefix_prompts(model, shared, 3)
        assert prompts is not None, shared
        ids = [[tok.bos_id, *tok.encode(p)] for p in prompts]
        assert all(tok.decode(i[1:]) == p for i, p in zip(ids, prompts))
        assert len({tuple(i[:shared]) for i in ids}) == 1 and len({i[shared] for i in ids}) == 3, shared
    assert strategies.prefix_lengths(str(dirs["t5"].resolve()), 16) and strategies.model_is_encoder_decoder(
        str(dirs["t5"].resolve()))              # T5's encoder prompts share no decoder prefix: plain requests there
