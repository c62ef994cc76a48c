"""T5 encoder inputs tokenized as transformers' standard pipeline does: a `tokenizer.json` with flan-t5's
post-processor (the template `$A </s>`) ends every encoder input with `</s>`, in minikv as in `tokenizer(text)`,
and the engine's greedy tokens equal `generate(**tokenizer(text))`. `add_special_tokens = False` switches the
template off. transformers is a test dependency only (minikv never imports it)."""
from __future__ import annotations

import json

import pytest
import torch

import minikv
from minikv.models import registry
from minikv.models.dir_tokenizer import HFTokenizer, load_tokenizer
from minikv.models.tokenizer import CharTokenizer

transformers = pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")
tokenizers = pytest.importorskip("tokenizers")
from tools import random_checkpoints

PROMPTS = ["3 7 11 15", "hello world", "250 263 276 289"]
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]          # flan-t5's ids: pad 0, eos 1, unk 2


def with_template(path, template: str | None):
    """Give path/tokenizer.json flan-t5's post-processor (`$A </s>`), or none."""
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    if template is not None:
        tok.post_processor = tokenizers.processors.TemplateProcessing(
            single=template, pair=f"{template} $B:1 </s>:1", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setattr(random_checkpoints, "SPECIALS", T5_SPECIALS)      # the BPE gets T5's special tokens
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = random_checkpoints.write("t5", tmp_path_factory.mktemp("t5_template"), randomize=True)
    finally:
        mp.undo()
    yield with_template(path, "$A </s>")
    torch.set_num_threads(threads)


def hf_tokenizer(path):
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), pad_token="<pad>",
                                                eos_token="</s>", unk_token="<unk>")


def test_encoder_ids_equal_transformers_tokenizer(t5_dir):
    assert json.loads((t5_dir / "tokenizer.json").read_text())["post_processor"]["type"] == "TemplateProcessing"
    ours, theirs = load_tokenizer(t5_dir), hf_tokenizer(t5_dir)
    assert isinstance(ours, HFTokenizer) and ours.add_special_tokens and ours.eos_id == 1
    for prompt in PROMPTS:
        ids = ours.encode(prompt)
        assert ids == theirs(prompt)["input_ids"] and ids[-1] == ours.eos_id, prompt
        assert ours.decode(ids) == prompt                       # the special is skipped on the way back
    raw = load_tokenizer(t5_dir, add_special_tokens=False)
    for prompt in PROMPTS:
        assert raw.encode(prompt) == theirs(prompt, add_special_tokens=False)["input_ids"]
        assert raw.encode(prompt) == ours.encode(prompt)[:-1]


@torch.no_grad()
def test_engine_equals_transformers_standard_pipeline(t5_dir):
    hf = transformers.T5ForConditionalGeneration.from_pretrained(t5_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    theirs = hf_tokenizer(t5_dir)
    llm = minikv.LLM(model=str(t5_dir), backend="torch", max_num_seqs=3)
    params = minikv.SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        expected = hf.generate(**theirs(prompt, return_tensors="pt"), max_new_tokens=5, do_sample=False)[0, 1:]
        assert out.token_ids == expected.tolist(), prompt
    # The switch: without the template the encoder sees one token less, as transformers' add_special_tokens=False.
    llm.tokenizer.add_special_tokens = False
    raw = llm.generate(PROMPTS[:1], params, use_tqdm=False)[0]
    ids = theirs(PROMPTS[0], add_special_tokens=False, return_tensors="pt")
    assert raw.token_ids == hf.generate(**ids, max_new_tokens=5, do_sample=False)[0, 1:].tolist()


def test_decoder_only_and_shipped_tokenizers_add_nothing(tmp_path):
    """A decoder-only directory's tokenizer applies no template (the engine puts BOS in front itself), and the
    shipped models' character tokenizers have none: their tokens do not change."""
    path = tmp_path / "gemma"
    random_checkpoints.build_tokenizer(path)
    (path / "config.json").write_text(json.dumps({"model_type": "gemma4_text", "bos_token_id": 2,
                                                  "eos_token_id": 1, "pad_token_id": 0, "vocab_size": 448}))
    tok = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.post_processor = tokenizers.processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 2)])
    tok.save(str(path / "tokenizer.json"))
    gemma = load_tokenizer(path)
    assert not gemma.add_special_tokens and gemma.encode("3 7 11") == tok.encode("3 7 11",
                                                                                  add_special_tokens=False).ids
    for name in ("tiny-t5", "tiny-gemma4"):
        shipped = registry.get_tokenizer(name)
        assert isinstance(shipped, CharTokenizer)
        assert shipped.encode("12") == [shipped.alphabet.index(c) + 3 for c in "12"]
