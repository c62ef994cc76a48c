"""LLM.chat: the checkpoint's own chat template (tokenizer_config.json's `chat_template`, or chat_template.jinja),
rendered as transformers' apply_chat_template renders it, tokenized as it stands, then generated; a model without a
template, a template that refuses the conversation, and badly shaped messages are typed errors."""
from __future__ import annotations

import json
import shutil

import pytest

import minikv
from minikv.engine.chat import ChatTemplateError
from minikv.kernels.errors import InvalidTypeError

transformers = pytest.importorskip("transformers", reason="the oracle: pip install -e .[dev]")
from tools import random_checkpoints  # noqa: E402

# A Gemma-style template, written here: turns between <start_of_turn>/<end_of_turn>, the assistant called "model",
# no system role, strict alternation, BOS written by the template itself.
TEMPLATE = (
    "{{ bos_token }}"
    "{% set ns = namespace(turns=0) %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('this model takes no system message') }}{% endif %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user, assistant, user, ...') }}{% endif %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ message['content'] | trim }}<end_of_turn>\n"
    "{% set ns.turns = ns.turns + 1 %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
CONVERSATIONS = [
    [{"role": "user", "content": "continue 3 7 11 15"}],
    [{"role": "user", "content": " hello world "}, {"role": "assistant", "content": "19 23"},
     {"role": "user", "content": "the quick brown fox"}],
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tokenizers import AddedToken, Tokenizer
    path = random_checkpoints.write("gemma4", tmp_path_factory.mktemp("chat") / "ckpt", randomize=True)
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))          # Gemma's turn markers are tokens of their own
    tok.add_special_tokens([AddedToken("<start_of_turn>", special=True), AddedToken("<end_of_turn>", special=True)])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
        "pad_token": "<pad>", "chat_template": TEMPLATE}))
    return path


@pytest.fixture(scope="module")
def llm(checkpoint):
    return minikv.LLM(model=str(checkpoint), backend="torch", max_num_seqs=2)


def test_rendered_prompt_equals_transformers(checkpoint, llm):
    hf = transformers.AutoTokenizer.from_pretrained(checkpoint)
    params = minikv.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    outs = llm.chat(CONVERSATIONS, params, use_tqdm=False)
    for conv, out in zip(CONVERSATIONS, outs):
        expected = hf.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
        assert out.prompt == expected and expected.startswith("<bos><start_of_turn>user\n")
        assert out.prompt_token_ids == hf(expected, add_special_tokens=False)["input_ids"]
        assert out.prompt_token_ids[0] == llm.tokenizer.bos_id and out.prompt_token_ids.count(llm.tokenizer.bos_id) == 1
        assert len(out.token_ids) == 4
    # The same tokens through generate: chat is rendering, then generation.
    again = llm.generate([{"prompt_token_ids": o.prompt_token_ids} for o in outs], params, use_tqdm=False)
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]
    single = llm.chat(CONVERSATIONS[0], params, use_tqdm=False)
    assert len(single) == 1 and single[0].prompt == outs[0].prompt
    no_prompt = llm.chat(CONVERSATIONS[0], params, use_tqdm=False, add_generation_prompt=False)[0].prompt
    assert no_prompt == hf.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=False)


def test_template_file_beside_the_config(checkpoint, tmp_path):
    path = shutil.copytree(checkpoint, tmp_path / "ckpt")
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "chat_template.jinja").write_text(config.pop("chat_template"))
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    llm = minikv.LLM(model=str(path), backend="torch", max_num_seqs=2)
    hf = transformers.AutoTokenizer.from_pretrained(path)
    out = llm.chat(CONVERSATIONS[1], minikv.SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)[0]
    assert out.prompt == hf.apply_chat_template(CONVERSATIONS[1], tokenize=False, add_generation_prompt=True)


def test_refusals_are_typed_errors(llm):
    with pytest.raises(ChatTemplateError, match="refused this conversation: this model takes no system message"):
        llm.chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], use_tqdm=False)
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        llm.chat([{"role": "assistant", "content": "hi"}], use_tqdm=False)
    with pytest.raises(InvalidTypeError, match="'role'"):
        llm.chat([{"content": "hi"}], use_tqdm=False)
    with pytest.raises(InvalidTypeError, match="messages must be"):
        llm.chat("hello", use_tqdm=False)
    with pytest.raises(ValueError, match="1 conversations but 2 sampling params"):
        llm.chat(CONVERSATIONS[0], [minikv.SamplingParams()] * 2, use_tqdm=False)
    assert not llm.has_unfinished()


def test_a_model_without_a_template_says_so():
    llm = minikv.LLM(model="tiny-gemma4", backend="torch", max_num_seqs=2)
    with pytest.raises(ChatTemplateError, match="'tiny-gemma4' has no chat template.*pass chat_template=") as err:
        llm.chat([{"role": "user", "content": "3 7 11"}], use_tqdm=False)
    assert isinstance(err.value, ValueError)
    out = llm.chat([{"role": "user", "content": "3 7 11"}], minikv.SamplingParams(temperature=0, max_tokens=4),
                   chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}", use_tqdm=False)[0]
    assert out.prompt == "3 7 11" and out.prompt_token_ids == llm.tokenizer.encode("3 7 11")    # no BOS added
