"""The shipped trained checkpoints tiny-gemma4 and tiny-t5: transformers reads them to the same logits, they solve
their tasks (dense greedy, every fake-quantized K/V format), their directories are complete and small, and the
task refuses prompts outside the documented domain."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from minikv import tasks
from minikv.models import hf_checkpoint, registry, train
from minikv.models.gemma4 import FULL, SLIDING

NAMES = ("tiny-gemma4", "tiny-t5")
QUICK_N = 50


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Tiny matmuls: one thread is faster, and the dense references run like the engine's tests."""


# ---- the directories ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_directory_is_complete_small_and_records_its_recipe(name):
    path = registry.checkpoint_dir(name)
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "minikv_tokenizer.json", "training.json"} <= files
    assert registry.weights_path(name).stat().st_size <= 5 * 1024 * 1024
    assert all(t.dtype == torch.float16 for t in hf_checkpoint.read_tensors(path).values())
    record = json.loads((path / "training.json").read_text())["training"]
    assert record["model"] == name and record["seed"] == 0
    # a field added to Recipe after a run is recorded as absent: that run used the field's default
    defaults = {f.name: f.default for f in dataclasses.fields(train.Recipe)}
    assert set(record["recipe"]) <= set(train.RECIPES[name].__dict__)
    assert {k: record["recipe"].get(k, defaults[k]) for k in defaults} == train.RECIPES[name].__dict__
    assert record["steps"] == train.RECIPES[name].steps
    config = json.loads((path / "config.json").read_text())
    assert config.pop("dtype") == "float16"
    assert config == json.loads(json.dumps(registry.model_config(name).to_hf_dict()))
    assert registry.load_model(name).config == registry.model_config(name)


def test_gemma4_topology_has_both_layer_types_and_two_sharers_per_cache():
    config = registry.model_config("tiny-gemma4")
    assert {SLIDING, FULL} <= set(config.layer_types)
    sharers: dict[int, list[int]] = {}
    for layer, source in config.kv_sharing.items():
        sharers.setdefault(source, []).append(layer)
        assert config.layer_types[layer] == config.layer_types[source]
    assert {config.layer_types[s] for s in sharers} == {SLIDING, FULL}
    assert all(len(v) >= 2 for v in sharers.values())
    assert len(set(config.layer_head_dims)) == 1 and config.layer_head_dims[0] in (16, 32, 64)


# ---- parity with transformers ---------------------------------------------------------------------------------------

def _prompts(name: str, n: int = 4) -> list[str]:
    return tasks.for_model(name).prompts(n, seed=7)


def _shipped_pair(name: str, hf_class_name: str):
    """(transformers' model, minikv's model, tokenizer) of one shipped checkpoint directory, float32."""
    transformers = pytest.importorskip("transformers", reason="needs the dev extra: pip install -e .[dev]")
    hf_class = getattr(transformers, hf_class_name)
    hf = hf_class.from_pretrained(registry.checkpoint_dir(name), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    return hf, registry.load_model(name), registry.get_tokenizer(name)


@torch.no_grad()
def test_gemma4_checkpoint_matches_transformers():
    hf, ours, tok = _shipped_pair("tiny-gemma4", "Gemma4ForCausalLM")
    for prompt in _prompts("tiny-gemma4"):
        ids = torch.tensor([[tok.bos_id, *tok.encode(prompt)]])
        torch.testing.assert_close(ours.logits(ids), hf(ids).logits.float(), atol=1e-4, rtol=1e-4)
        expected = hf.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
        assert ours.greedy(ids, 12)[0].tolist() == expected.tolist(), prompt


@torch.no_grad()
def test_t5_checkpoint_matches_transformers():
    hf, ours, tok = _shipped_pair("tiny-t5", "T5ForConditionalGeneration")
    start = ours.config.decoder_start_token_id
    for prompt in _prompts("tiny-t5"):
        enc = torch.tensor([tok.encode(prompt)])
        dec = torch.tensor([[start, *tok.encode(tasks.for_model("tiny-t5").expected(prompt, len(prompt)))]])
        want = hf(input_ids=enc, decoder_input_ids=dec).logits.float()
        torch.testing.assert_close(ours.compute_logits(ours.decode(dec, ours.encode(enc))), want,
                                   atol=1e-4, rtol=1e-4)
        expected = hf.generate(enc, max_new_tokens=len(prompt) + 1, do_sample=False)[0, 1:]
        assert ours.greedy(enc, len(prompt) + 1)[0].tolist() == expected.tolist(), prompt


# ---- quality -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", (None,) + train.FAKE_QUANT_FORMATS)
@pytest.mark.parametrize("name", NAMES)
def test_dense_greedy_solves_held_out_prompts(name, fmt):
    result = train.evaluate_dense(name, QUICK_N, fmt, seed=11)
    assert result["exact_match"] == 1.0, result["failures"][:5]


# ---- the task's domain ---------------------------------------------------------------------------------------------

def test_window_task_domain_and_clear_errors():
    task = tasks.for_model("tiny-gemma4")
    assert task.expected("3 7 11 15", 12) == " 19 23 27 31"
    assert task.expected("250 263 276", 12) == " 289 302 315"   # a window that does not start near 0
    assert task.expected("0 1", 6) == " 2 3 4"
    top = tasks.WINDOW_MAX_FIRST
    assert task.check(f"{top} {top + 1}", f" {top + 2}")
    for prompt, why in [(f"{top + 1} {top + 2}", "outside"), ("9 5 1", "outside"), ("4 4 4", "outside"),
                        (f"0 {tasks.WINDOW_MAX_STEP + 1}", "outside"), ("3 7 12", "not an arithmetic"),
                        ("03 7", "no leading zeros"), ("3", "two or more"), ("3 7 a", "two or more"),
                        (" ".join(str(i) for i in range(tasks.WINDOW_MAX_TERMS + 1)), "outside")]:
        with pytest.raises(ValueError, match=why):
            task.expected(prompt, 12)


def test_sort_distinct_task():
    task = tasks.for_model("tiny-t5")
    assert task.expected("banana42", 48) == "24abn" and task.max_tokens("banana42") == 6
    assert task.check("zz9a0", "09az") and not task.check("zz9a0", "09a")
    with pytest.raises(ValueError, match="digits and lowercase"):
        task.expected("Banana", 8)


def test_window_task_holds_out_whole_sequence_families():
    task = tasks.for_model("tiny-gemma4")
    prompts = task.prompts(300, seed=3)
    assert len(set(prompts)) > 290 and any(len(p.split()) == 2 for p in prompts)
    for prompt in prompts:
        first, step, _ = task.validate(prompt)
        assert task.is_held_out(first, step)
        assert all(task.is_held_out(first + k * step, step) for k in range(1, 30))   # every window too
    import random
    rng = random.Random(0)
    assert not any(task.is_held_out(*task.training_start(rng)) for _ in range(2000))
    assert len({len(p) + 1 for p in task.prompts(5, num_tokens=20)}) == 1


# ---- the engine --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_per_token_head"])
def test_gemma4_runs_in_the_paged_engine_like_dense(kv_cache_dtype):
    import minikv
    prompts = _prompts("tiny-gemma4", 6)
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype=kv_cache_dtype, backend="torch", max_num_seqs=6)
    assert sum(1 for a in llm.attention_layers.values() if a.kv_sharing_target is not None) == 4
    outs = llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    fmt = None if kv_cache_dtype == "auto" else kv_cache_dtype
    model = registry.load_model("tiny-gemma4")
    model.kv_transform = train.kv_transform_for(fmt)
    assert [o.token_ids for o in outs] == train.generate_dense(model, prompts, 12)
    task = tasks.for_model("tiny-gemma4")
    assert all(task.check(p, o.text) for p, o in zip(prompts, outs))


@pytest.mark.parametrize("kv_cache_dtype", ["int8_per_token_head", "fp8_per_token_head"])
def test_t5_runs_in_the_paged_engine_like_dense(kv_cache_dtype):
    """tiny-t5 through the engine (bias table in the paged self attention, cross pool, dense encoder) gives the
    dense fake-quantized greedy ids; auto and fp8 over 30 prompts, and random configs against transformers, are
    in tests/test_engine_t5.py."""
    import minikv
    prompts = _prompts("tiny-t5", 6)
    task = tasks.for_model("tiny-t5")
    llm = minikv.LLM(model="tiny-t5", kv_cache_dtype=kv_cache_dtype, backend="torch", max_num_seqs=6)
    kinds = [a.kind for a in llm.attention_layers.values()]
    assert kinds.count("self") == kinds.count("cross") == 3
    outs = llm.generate(prompts, [minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p)) for p in prompts])
    model = registry.load_model("tiny-t5")
    model.kv_transform = train.kv_transform_for(kv_cache_dtype)
    dense = train.generate_dense(model, prompts, max(task.max_tokens(p) for p in prompts))
    eos = llm.tokenizer.eos_id
    assert [o.token_ids for o in outs] == [d[:-1] if d[-1:] == [eos] else d for d in dense]
    assert all(task.check(p, o.text) for p, o in zip(prompts, outs))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@torch.no_grad()
def test_gemma4_window_is_shorter_than_long_prompts_and_the_engine_slides_it(backend):
    """tiny-gemma4's sliding layers (and the layers sharing their cache) see only the last `sliding_window`
    positions, far fewer than a long prompt of the domain holds; the window changes the logits, and the engine
    (Triton kernels or their torch references) gives the dense model's greedy ids, which are right."""
    import minikv
    from minikv.models.gemma4 import Gemma4Config, Gemma4ForCausalLM
    window = registry.model_config("tiny-gemma4").sliding_window
    task, tok = tasks.for_model("tiny-gemma4"), registry.get_tokenizer("tiny-gemma4")
    prompts = task.prompts(1, seed=7, num_tokens=task.max_prompt_tokens) + task.prompts(1, seed=7, num_tokens=48)
    assert all(len(p) + 1 > window for p in prompts) and task.max_prompt_tokens > 2 * window
    model = registry.load_model("tiny-gemma4")
    unwindowed = Gemma4ForCausalLM(Gemma4Config.from_hf_dict(
        {**registry.CHECKPOINT_CONFIGS["tiny-gemma4"], "sliding_window": 10_000}, name="tiny-gemma4")).eval()
    unwindowed.load_state_dict(model.state_dict())
    ids = torch.tensor([[tok.bos_id, *tok.encode(prompts[0])]])
    assert not torch.allclose(model.logits(ids), unwindowed.logits(ids), atol=1e-3)
    llm = minikv.LLM(model="tiny-gemma4", backend=backend, max_num_seqs=2)
    assert {a.impl.sliding_window for a in llm.attention_layers.values()} == {0, window}
    outs = llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert [o.token_ids for o in outs] == train.generate_dense(model, prompts, 12)
    assert all(task.check(p, o.text) for p, o in zip(prompts, outs))


def test_gemma4_answers_small_numbers_a_user_tries_first():
    """The first prompts a user types are small numbers; uniform training draws almost never contain them, so the
    recipe draws part of its sequences log-uniformly. Dense, 120 prompts of first term 0-30 and step 1-10, plus the
    examples the docs use."""
    task = tasks.for_model("tiny-gemma4")
    prompts = ["1 2 3", "10 20 30", "2 4 6 8", "0 5", "3 7 11", "250 263 276"] + task.small_number_prompts(120)
    model = registry.load_model("tiny-gemma4")
    got = train.generate_dense(model, prompts, task.default_max_tokens)
    wrong = [p for p, ids in zip(prompts, got) if ids != train.expected_ids("tiny-gemma4", p)]
    assert len(wrong) <= 1, wrong


@pytest.mark.parametrize("name", NAMES)
def test_damaged_weight_bytes_are_refused(name, tmp_path):
    """The header still parses, one byte of tensor data is flipped: the recorded SHA-256 catches it."""
    import shutil
    path = tmp_path / name
    shutil.copytree(registry.checkpoint_dir(name), path)
    assert hf_checkpoint.load_checkpoint(path) is not None                    # the copy loads as it is
    file = path / hf_checkpoint.WEIGHTS_FILE
    data = bytearray(file.read_bytes())
    data[-100] ^= 0x01
    file.write_bytes(bytes(data))
    with pytest.raises(hf_checkpoint.CheckpointError, match="SHA-256"):
        hf_checkpoint.load_checkpoint(path)
