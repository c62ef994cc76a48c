"""`minikv checkpoint new` writes a random checkpoint directory that transformers loads and whose logits equal
minikv's, without importing transformers itself; E2B's size is checked by its config and tensor shapes only."""
from __future__ import annotations

import json
import sys

import pytest
import torch

import minikv
from minikv.cli import main
from minikv.models import new_checkpoint

transformers = pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")

PROMPTS = ["3 7 11 15", "250 263 276 289", "hello world"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setitem(sys.modules, "transformers", None)           # `import transformers` fails while they are written
    try:
        return {arch: new_checkpoint.write(tmp_path_factory.mktemp(arch) / "ckpt", arch=arch, progress=False)
                for arch in ("gemma4", "t5")}
    finally:
        mp.undo()


def test_the_directory_has_what_transformers_reads(dirs):
    for path in dirs.values():
        assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                          "tokenizer_config.json"]
    tok = transformers.AutoTokenizer.from_pretrained(dirs["gemma4"])
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert tok.decode(tok("250 263 276")["input_ids"]) == "250 263 276"


@pytest.mark.parametrize("arch", ["gemma4", "t5"])
@torch.no_grad()
def test_transformers_loads_it_and_its_logits_equal_minikv(dirs, arch):
    path = dirs[arch]
    ours = minikv.models.registry.load_model(str(path))
    tok = minikv.models.registry.get_tokenizer(str(path))
    if arch == "gemma4":
        hf = transformers.Gemma4ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    else:
        hf = transformers.T5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    for prompt in PROMPTS:
        if arch == "gemma4":
            ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
            theirs, mine = hf(ids).logits, ours.logits(ids)
        else:
            enc = torch.tensor([tok.encode(prompt)])
            dec = torch.tensor([[0, 5, 9]])
            theirs = hf(input_ids=enc, decoder_input_ids=dec).logits
            mine = ours.compute_logits(ours.decode(dec, ours.encode(enc, torch.ones_like(enc, dtype=torch.bool)),
                                                   torch.ones_like(enc, dtype=torch.bool)))
        assert theirs.shape == mine.shape and theirs.abs().max() > 0.05
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    llm = minikv.LLM(model=str(path), backend="torch", max_num_seqs=2)
    out = llm.generate(PROMPTS[:2], minikv.SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
                       use_tqdm=False)
    assert [len(o.token_ids) for o in out] == [3, 3]


def test_the_same_seed_writes_the_same_bytes(dirs, tmp_path):
    again = new_checkpoint.write(tmp_path / "again", arch="gemma4", progress=False)
    assert (again / "model.safetensors").read_bytes() == (dirs["gemma4"] / "model.safetensors").read_bytes()
    other = new_checkpoint.write(tmp_path / "other", arch="gemma4", seed=1, progress=False)
    assert (other / "model.safetensors").read_bytes() != (again / "model.safetensors").read_bytes()


def test_e2b_is_gemma4_e2b_in_full_without_building_it():
    """Its config and every tensor's shape, against transformers' own model of that config (on the meta device)."""
    config, model = new_checkpoint.plan("gemma4", "e2b", vocab=448)
    assert {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size",
                                   "max_position_embeddings", "num_kv_shared_layers", "head_dim",
                                   "global_head_dim", "sliding_window")} == {
        "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35, "vocab_size": 262_144,
        "max_position_embeddings": 131_072, "num_kv_shared_layers": 20, "head_dim": 256, "global_head_dim": 512,
        "sliding_window": 512}
    shapes = {k: tuple(model.state_dict()[k].shape) for k in new_checkpoint.init_rules(model)}
    hf_config = transformers.Gemma4TextConfig(**{k: v for k, v in config.items() if k != "dtype"})
    with torch.device("meta"):
        hf = transformers.Gemma4ForCausalLM(hf_config)
    theirs = {k: tuple(v.shape) for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert theirs == shapes and len(shapes) > 400


@pytest.mark.parametrize("args, fragment", [
    (["--arch", "t5", "--size", "e2b"], "t5 comes in sizes tiny and base, not 'e2b'"),
    (["--arch", "llama"], "argument --arch: invalid choice: 'llama'"),
])
def test_bad_choices_are_one_line(tmp_path, capsys, args, fragment):
    with pytest.raises(SystemExit) as exc:
        main(["checkpoint", "new", str(tmp_path / "x"), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
    assert not (tmp_path / "x").exists()


def test_a_non_empty_directory_needs_force(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit) as exc:
        main(["checkpoint", "new", str(tmp_path), "--arch", "gemma4"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("minikv: error: ") and "--force" in err and \
        len(err.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert main(["checkpoint", "new", str(tmp_path), "--arch", "gemma4", "--force"]) == 0
    assert "written to" in capsys.readouterr().out
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gemma4_text"
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_large_tensors_are_streamed_in_chunks_into_a_valid_file(tmp_path, monkeypatch):
    """E2B's tensors span many chunks (its per-layer embeddings: 2.3 G values); here, chunks of 8 values."""
    from safetensors.torch import load_file
    monkeypatch.setattr(new_checkpoint, "CHUNK", 8)
    shapes = {"w": (50, 7), "b": (9,), "norm": (3,), "scalar": ()}
    rules = {"w": 0.5, "b": 0.0, "norm": None, "scalar": None}
    size = new_checkpoint.write_safetensors(tmp_path / "m.safetensors", shapes, rules, seed=0, progress=False)
    assert size == (tmp_path / "m.safetensors").stat().st_size
    t = load_file(str(tmp_path / "m.safetensors"))
    assert {k: tuple(v.shape) for k, v in t.items()} == shapes and all(v.dtype == torch.bfloat16 for v in t.values())
    assert torch.equal(t["b"], torch.zeros(9, dtype=torch.bfloat16)) and t["norm"].eq(1).all() and t["scalar"] == 1
    w = t["w"].float()
    assert len({tuple(r.tolist()) for r in w}) == 50 and 0.35 < w.std() < 0.65      # every chunk its own draw
