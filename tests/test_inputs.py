"""The input matrix: misuse of LLM(...), of the engine's methods and of the `minikv` command, each case refused with
an error that names the argument and what is allowed (or made to work), and a usage error of the command is one
line with exit status 2. (Malformed checkpoint files are tested with the checkpoint loader; the generate() and
SamplingParams matrices are in test_engine_step_api.py.)"""
from __future__ import annotations

import shutil

import pytest
import torch

import minikv
from minikv.cli import main
from minikv.models import registry

GEMMA4, T5 = "tiny-gemma4", "tiny-t5"

# (case, LLM keyword arguments, error type, a fragment the message must hold: the argument and what is allowed)
LLM_INPUTS = [
    ("model unknown", dict(model="gpt-5"), ValueError, "tiny-gemma4, tiny-t5"),
    ("model not str", dict(model=3), TypeError, "model must be a str"),
    ("model None", dict(model=None), TypeError, "model must be a str"),
    ("kv_cache_dtype unknown", dict(kv_cache_dtype="int4"), ValueError, "auto, fp8, int8_per_token_head"),
    ("kv_cache_dtype not str", dict(kv_cache_dtype=torch.int8), TypeError, "kv_cache_dtype must be a str, one of"),
    ("kv_scale_placement None", dict(kv_scale_placement=None), TypeError, "kv_scale_placement must be a str, one "
                                                                           "of row, block"),
    ("max_num_seqs 0", dict(max_num_seqs=0), ValueError, "max_num_seqs must be at least 1"),
    ("max_num_seqs float", dict(max_num_seqs=2.0), TypeError, "max_num_seqs must be an int"),
    ("max_num_seqs str", dict(max_num_seqs="4"), TypeError, "max_num_seqs must be an int"),
    # regression: block_size=0 said "at least 1" although only 8/16/32/64 are allowed
    ("block_size 0", dict(block_size=0), ValueError, "block_size must be one of 8, 16, 32, 64"),
    ("block_size 12", dict(block_size=12), ValueError, "block_size must be one of 8, 16, 32, 64"),
    ("block_size bool", dict(block_size=True), TypeError, "block_size must be an int, one of 8, 16, 32, 64"),
    ("prefix caching int", dict(enable_prefix_caching=1), TypeError, "enable_prefix_caching must be True or False"),
    ("sanitize str", dict(sanitize="yes"), TypeError, "sanitize must be True or False"),
    ("seed negative", dict(seed=-1), ValueError, "seed must be between 0"),
    ("num_blocks 0", dict(num_blocks=0), ValueError, "num_blocks must be at least 1"),
    ("num_blocks float", dict(num_blocks=8.0), TypeError, "num_blocks must be an int or None"),
    ("max_num_batched_tokens 0", dict(max_num_batched_tokens=0), ValueError, "max_num_batched_tokens"),
    ("backend unknown", dict(backend="cuda"), ValueError, "choose one of triton, torch"),
    ("device unknown", dict(device="tpu"), ValueError, "'cpu', 'cuda' or 'cuda:N'"),
    ("device garbage", dict(device="cpu:zero"), ValueError, "'cpu', 'cuda' or 'cuda:N'"),
    ("device not str", dict(device=0), TypeError, "device must be a str"),
    # regression: device="cpu:3" was accepted
    ("device cpu:3", dict(device="cpu:3"), ValueError, "there is one CPU device; use 'cpu'"),
    ("dtype string", dict(dtype="float32"), TypeError, "dtype must be torch.float32"),
    ("reintroduce str", dict(reintroduce="scale-wipe"), TypeError, "not a string"),
    ("reintroduce unknown", dict(reintroduce=("nope",)), ValueError, "known: scale-wipe, cross-stride"),
    # regression: reintroduce=None and a nested list raised TypeError from inside
    ("reintroduce None", dict(reintroduce=None), TypeError, "reintroduce must be a tuple or list of defect names"),
    ("reintroduce nested", dict(reintroduce=[["scale-wipe"]]), TypeError, "reintroduce holds defect names (str)"),
    ("too much memory", dict(num_blocks=2**40), MemoryError, "lower num_blocks"),
    ("scale-wipe without sharing", dict(model=T5, kv_cache_dtype="int8_per_token_head", reintroduce=("scale-wipe",)),
     ValueError, "use tiny-gemma4"),
    ("cross-stride decoder-only", dict(kv_cache_dtype="fp8", reintroduce=("cross-stride",)), ValueError,
     "use tiny-t5"),
    ("cross-stride 16-bit", dict(model=T5, reintroduce=("cross-stride",)), ValueError, "use kv_cache_dtype='fp8'"),
    ("context read 16-bit", dict(model=T5, reintroduce=("cross-fp8-context-read",)), ValueError, "use "
                                                                                                 "kv_cache_dtype"),
    # regression: cross options on a decoder-only model were silently ignored
    ("cross_pool_blocks decoder-only", dict(cross_pool_blocks=4), ValueError, "cross_pool_blocks applies to "
                                                                              "encoder-decoder models"),
    ("cross_context_path decoder-only", dict(repro=("cross_context_path", "fallback")), ValueError, "decoder-only"),
    ("paged_context decoder-only", dict(repro=("paged_context", True)), ValueError, "decoder-only"),
    ("cross_construction decoder-only", dict(repro=("cross_construction", "deferred")), ValueError, "decoder-only"),
]


@pytest.mark.parametrize("case,kw,error,fragment", LLM_INPUTS, ids=[c[0] for c in LLM_INPUTS])
def test_llm_rejects(case, kw, error, fragment):
    kw.setdefault("backend", "torch")
    if "repro" in kw:                       # (field, value): built here, so that collection builds no config
        field, value = kw["repro"]
        kw["repro"] = minikv.ReproConfig(**{field: value})
    with pytest.raises(error) as info:
        minikv.LLM(**kw)
    assert fragment in str(info.value)
    if error in (ValueError, TypeError):      # a bad option is bad input to the CLI as well: one base class
        assert isinstance(info.value, minikv.MinikvError) and info.value.exit_status == 2


REPRO_INPUTS = [
    ("warmup unknown", dict(warmup="full"), ValueError, "choose one of dummy, capture"),
    ("reinit_scales_on_wake int", dict(reinit_scales_on_wake=1), TypeError, "reinit_scales_on_wake must be True"),
    ("cross path unknown", dict(cross_context_path="fast"), ValueError, "choose one of fused, fallback"),
    ("construction unknown", dict(cross_construction="late"), ValueError, "choose one of eager, deferred"),
    ("arena unknown", dict(kv_arena="two"), ValueError, "choose one of one, per-pool"),
    ("check_layout str", dict(check_layout="no"), TypeError, "check_layout must be True or False"),
]


@pytest.mark.parametrize("case,kw,error,fragment", REPRO_INPUTS, ids=[c[0] for c in REPRO_INPUTS])
def test_repro_config_rejects(case, kw, error, fragment):
    with pytest.raises(error, match=fragment) as info:
        minikv.ReproConfig(**kw)
    assert isinstance(info.value, minikv.MinikvError)


def test_a_reproduction_switch_given_to_llm_names_its_new_spelling():
    with pytest.raises(TypeError, match=r"repro=minikv\.ReproConfig\(warmup='capture'\)"):
        minikv.LLM(backend="torch", warmup="capture")
    with pytest.raises(TypeError, match="unexpected keyword argument 'warmpu'"):
        minikv.LLM(backend="torch", warmpu="capture")
    with pytest.raises(TypeError, match="repro must be a minikv.ReproConfig"):
        minikv.LLM(backend="torch", repro={"warmup": "capture"})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device"):
        minikv.LLM(device="cuda")


# ---- the engine's methods --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm():
    return minikv.LLM(model=GEMMA4, backend="torch", kv_cache_dtype="int8_per_token_head", max_num_seqs=2)


def test_abort_takes_a_request_id(llm):
    rid = llm.add_request("3 7", minikv.SamplingParams(temperature=0, max_tokens=2))
    with pytest.raises(TypeError, match="request_id must be an int, got str '0'"):    # regression: returned False
        llm.abort(str(rid))
    with pytest.raises(ValueError, match="request_id must be at least 0"):
        llm.abort(-1)
    assert llm.has_unfinished() and llm.abort(rid) and not llm.has_unfinished()
    assert llm.abort(rid) is False                        # known id, no longer in flight


def test_step_capture_must_be_a_bool(llm):
    llm.add_request("3 7", minikv.SamplingParams(temperature=0, max_tokens=1))
    with pytest.raises(TypeError, match="capture must be True or False, got str 'no'"):   # regression: counted as true
        llm.step(capture="no")
    while llm.has_unfinished():
        assert llm.step().trace.events[0].tensors is None


def test_sleep_free_after_discard_drops_the_arena(llm):
    with pytest.raises(ValueError, match="unknown sleep mode 'gone'; choose one of free, discard"):
        llm.sleep("gone")
    llm.sleep("discard")
    assert llm.arena is not None                          # discard keeps the storage
    llm.sleep("free")                                     # regression: kept the arena
    assert llm.arena is None and all(a.kv_cache is None for a in llm.attention_layers.values())
    llm.wake_up()
    assert llm.arena is not None and llm.generate("3 7 11", minikv.SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)


def test_a_request_that_can_never_fit_is_named_as_the_caller_knows_it():
    small = minikv.LLM(model=GEMMA4, backend="torch", num_blocks=2, block_size=8, max_num_seqs=1)
    long = "3 7 11 15 19 23 27 31"
    # the pool holds 16 tokens, so max_model_len defaults to 16 and the request is refused for it
    with pytest.raises(ValueError, match=r"^prompts\[1\] is 22 tokens \(with BOS\).*max_model_len is 16"):
        small.generate(["3 7", long], minikv.SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    with pytest.raises(ValueError, match=r"^the request is 22 tokens"):
        small.add_request(long, minikv.SamplingParams(temperature=0, max_tokens=12))
    assert not small.has_unfinished()


# ---- the minikv command -----------------------------------------------------------------------------------------
CLI_ERRORS = [
    # (case, argv, a fragment of the one error line)
    ("eval --n abc", ["eval", "--n", "abc"], "argument --n: must be a whole number of at least 1, got 'abc'"),
    ("eval --n 0", ["eval", "--n", "0"], "argument --n: must be at least 1, got 0"),
    ("generate model unknown", ["generate", "--model", "nope", "3"], "unknown model 'nope'; choose one of tiny-gemma4"),
    ("generate model missing path", ["generate", "--model", "/no/such/dir", "3"], "'/no/such/dir' is neither"),
    ("generate outside alphabet", ["generate", "--backend", "torch", "3X"], "not in the tokenizer's alphabet"),
    ("generate max_tokens room", ["generate", "--backend", "torch", "--max-tokens", "500", "3 7"], "lower max_tokens"),
    ("generate max_tokens 0", ["generate", "--max-tokens", "0", "3 7"], "argument --max-tokens: must be at least 1"),
    ("generate domain first term", ["generate", "--backend", "torch", "5000 6000"],
     "'5000 6000' is outside tiny-gemma4's domain: first term 0..999"),
    ("generate domain decreasing", ["generate", "--backend", "torch", "9 5 1"], "outside tiny-gemma4's domain"),
    ("generate t5 domain", ["generate", "--model", "tiny-t5", "--backend", "torch", "abc"],
     "'abc' is outside tiny-t5's domain: 4..40"),
    ("generate kv dtype", ["generate", "--kv-cache-dtype", "int4", "3 7"], "invalid choice: 'int4'"),
    ("generate temperature", ["generate", "--backend", "torch", "--temperature", "-2", "3 7"],
     "temperature must be 0 (greedy) or between"),
    ("generate top-p 0", ["generate", "--top-p", "0", "3 7"], "top_p must be in (0, 1] (1 keeps every token), got 0"),
    ("generate top-k -5", ["generate", "--top-k", "-5", "3 7"], "top_k must be 0 or -1 (every token) or at least 1"),
    ("generate top-k float", ["generate", "--top-k", "2.5", "3 7"], "argument --top-k: invalid int value"),
    ("generate min-p 2", ["generate", "--min-p", "2", "3 7"], "min_p must be in [0, 1]"),
    ("generate n 0", ["generate", "--n", "0", "3 7"], "argument --n: must be at least 1"),
    ("generate seed negative", ["generate", "--seed", "-1", "3 7"], "seed must be between 0"),
    ("generate stop empty", ["generate", "--stop", "", "3 7"], "stop strings must be non-empty"),
    ("generate device cpu:3", ["generate", "--device", "cpu:3", "3 7"], "there is one CPU device"),
    ("generate no prompts", ["generate"], "the following arguments are required: prompts"),
    ("eval path without task", ["eval", "--model", "/tmp", "--n", "2"], "pass --task"),
    ("train unknown", ["train", "tiny-gpt"], "invalid choice"),
    ("train steps 0", ["train", "tiny-gemma4", "--steps", "0"], "argument --steps: must be at least 1"),
    ("bench unknown", ["bench", "nope"], "invalid choice"),
    ("command unknown", ["nope"], "invalid choice: 'nope'"),
    # regression: `repro --requests 2` exited 1; `cross-stride --requests 0` blamed max_num_seqs
    ("repro scale-wipe requests 2", ["repro", "scale-wipe", "--requests", "2"],
     "--requests 2 is too few for --max-num-seqs 8: need at least 16"),
    ("repro scale-wipe max-num-seqs 0", ["repro", "scale-wipe", "--max-num-seqs", "0"],
     "argument --max-num-seqs: must be at least 1, got 0"),
    ("repro cross-stride requests 0", ["repro", "cross-stride", "--requests", "0"],
     "argument --requests: must be at least 1, got 0"),
    # regression: `bench engine --prompts 0` exited 0 with "0/0 right"
    ("bench engine prompts 0", ["bench", "engine", "--prompts", "0"], "argument --prompts: must be at least 1"),
    ("bench engine backend", ["bench", "engine", "--backends", "cuda"], "invalid choice: 'cuda'"),
    # regression: `demo --device gpu` printed a traceback
    ("demo device gpu", ["demo", "--device", "gpu"], "device 'gpu' is not a device string"),
]
if not torch.cuda.is_available():
    # regression: `demo --device cuda` printed a traceback
    CLI_ERRORS.append(("demo device cuda", ["demo", "--device", "cuda"], "no CUDA device is available"))


@pytest.mark.parametrize("case,argv,fragment", CLI_ERRORS, ids=[c[0] for c in CLI_ERRORS])
def test_cli_usage_error_is_one_line_and_exit_2(capsys, case, argv, fragment):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("minikv") and "Traceback" not in err


def test_cli_model_takes_a_checkpoint_directory(tmp_path, capsys):
    # regression: --model refused a checkpoint path although LLM(model=PATH) takes one
    path = shutil.copytree(registry.checkpoint_dir(GEMMA4), tmp_path / GEMMA4)
    assert main(["generate", "--model", str(path), "--backend", "torch", "--max-tokens", "6", "--temperature", "0",
                 "3 7 11"]) == 0
    assert capsys.readouterr().out.strip() == "'3 7 11' -> ' 15 19'  [length]"
    assert main(["eval", "--model", str(path), "--backend", "torch", "--n", "2"]) == 0     # its task: tiny-gemma4's
    assert "exact match 2/2" in capsys.readouterr().out
    assert main(["bench", "engine", "--model", str(path), "--backends", "torch", "--prompts", "2",
                 "--max-tokens", "2", "--max-num-seqs", "2"]) == 0
    assert "(2/2 right)" in capsys.readouterr().out
