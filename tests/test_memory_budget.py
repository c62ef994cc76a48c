"""The KV cache is sized from a memory budget or num_blocks, never from the config's context length times
max_num_seqs; max_model_len caps a request and is checked when the request is added (minikv.engine.memory)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import minikv
from minikv.cli import main
from minikv.engine import memory
from minikv.engine.memory import DEFAULT_CPU_KV_CACHE_BYTES, MaxModelLenError, size_cache
from minikv.models.registry import WEIGHTS_DIR, load_model


def _twin(tmp_path, positions: int):
    """tiny-gemma4's checkpoint with another max_position_embeddings (same weights)."""
    d = tmp_path / f"gemma4-{positions}"
    shutil.copytree(WEIGHTS_DIR / "tiny-gemma4", d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(config | {"max_position_embeddings": positions}))
    return d


PEAK_RSS = textwrap.dedent("""
    import resource, sys
    import minikv
    llm = minikv.LLM(model=sys.argv[1], backend="torch")
    out = llm.generate(["3 7 11"], minikv.SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    print(llm.max_model_len, llm.runner.num_blocks, out[0].token_ids,
          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
""")


def test_a_long_context_config_costs_no_more_memory_than_its_short_twin(tmp_path):
    """131,072 positions used to size a pool for 8 full-length sequences (1.7 GB); now the budget caps it."""
    runs = {}
    for positions in (256, 131_072):
        done = subprocess.run([sys.executable, "-c", PEAK_RSS, str(_twin(tmp_path, positions))],
                              capture_output=True, text=True, check=True,
                              env=os.environ | {"TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"})
        runs[positions] = done.stdout.split(maxsplit=2)[:2] + [done.stdout.rsplit(maxsplit=1)[1]]
    (short_len, short_blocks, short_rss), (long_len, long_blocks, long_rss) = runs[256], runs[131_072]
    assert int(short_len) == 256 and int(short_blocks) == 8 * 256 // 16
    # the default CPU budget decides: 64 MiB of 2 KiB tokens (4 owning layers x K,V x 2 heads x 32 x fp32)
    assert int(long_len) == DEFAULT_CPU_KV_CACHE_BYTES // 2048
    assert int(long_blocks) * 16 * 2048 == DEFAULT_CPU_KV_CACHE_BYTES
    assert int(long_rss) - int(short_rss) < 100 * 2**20, (short_rss, long_rss)


def test_no_model_buffer_grows_with_the_context_length(tmp_path):
    """RoPE is computed from the positions of each step: no table sized by max_position_embeddings."""
    short, long = (load_model(str(_twin(tmp_path, n))) for n in (256, 131_072))
    sizes = [sum(b.numel() for b in m.buffers()) + sum(p.numel() for p in m.parameters()) for m in (short, long)]
    assert sizes[0] == sizes[1]


@pytest.fixture(scope="module")
def llm():
    return minikv.LLM(model="tiny-gemma4", backend="torch", max_model_len=40)


def test_shipped_models_keep_their_pool_sizes(llm):
    """A budget larger than max_num_seqs full sequences need: the pool is what they need (8 x 128 / 16)."""
    assert minikv.LLM(model="tiny-gemma4", backend="torch").runner.num_blocks == 64
    assert llm.max_model_len == 40 and llm.runner.num_blocks == 8 * 3


def test_a_request_longer_than_max_model_len_is_refused_and_the_others_still_run(llm):
    greedy = minikv.SamplingParams(max_tokens=4, temperature=0)
    first = llm.add_request("3 7 11", greedy)
    with pytest.raises(MaxModelLenError, match=r"the request: 7 prompt tokens \+ max_tokens=34 is longer than "
                                               r"max_model_len=40: room for only 33 new tokens") as err:
        llm.add_request("3 7 11", minikv.SamplingParams(max_tokens=34, temperature=0))
    assert isinstance(err.value, ValueError) and "max_model_len" in str(err.value)
    with pytest.raises(MaxModelLenError, match=r"^prompts\[0\] is 42 tokens .*max_model_len is 40"):
        llm.generate(["1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17"], greedy)
    second = llm.add_request("5 10 15", greedy)
    done = {}
    while llm.has_unfinished():
        done.update({r.request_id: r for r in llm.step().finished})
    assert sorted(done) == [first, second] and all(len(r.token_ids) == 4 for r in done.values())


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_model_len=4096), "max_model_len=4096 is longer than the model's context length 128"),
    (dict(num_blocks=2, max_model_len=64), r"num_blocks=2 holds 2 blocks of 16 tokens = 32 tokens; lower "
                                           r"max_model_len to at most 32"),
    (dict(num_blocks=4, kv_cache_memory_bytes=2**20), "give one of them"),
    (dict(gpu_memory_utilization=0.0), r"gpu_memory_utilization must be in \(0, 1\]"),
])
def test_bad_sizes_are_value_errors_naming_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        minikv.LLM(model="tiny-gemma4", backend="torch", **kwargs)


def test_a_budget_sizes_the_pool_and_max_model_len():
    block = 2048 * 16                                   # tiny-gemma4, fp32: bytes of one block of every pool
    llm = minikv.LLM(model="tiny-gemma4", backend="torch", kv_cache_memory_bytes=5 * block + 100)
    assert (llm.runner.num_blocks, llm.max_model_len) == (5, 80)
    assert llm.arena.specs and sum(s.nbytes for s in llm.arena.specs.values()) <= 5 * block + 100
    with pytest.raises(ValueError, match="holds no block.*raise kv_cache_memory_bytes") as err:
        minikv.LLM(model="tiny-gemma4", backend="torch", kv_cache_memory_bytes=block - 1)
    assert isinstance(err.value, MemoryError)


def test_the_cross_pool_comes_out_of_the_budget():
    size = size_cache(block_bytes=100, cross_block_bytes=50, block_size=16, max_num_seqs=2, config_len=512,
                      encoder_len=512, num_blocks=None, cross_pool_blocks=None, max_model_len=None,
                      budget_bytes=2 * 32 * 50 + 1000, budget_source="test")
    assert (size.num_cross_blocks, size.num_blocks, size.max_model_len) == (64, 10, 160)


def test_out_of_memory_names_options_that_exist(monkeypatch):
    monkeypatch.setattr("minikv.engine.memory.available_host_bytes", lambda: 1000)
    with pytest.raises(MemoryError, match=r"lower kv_cache_memory_bytes \(--kv-cache-memory-bytes\), max_model_len"):
        minikv.LLM(model="tiny-gemma4", backend="torch")
    with pytest.raises(MemoryError, match=r"lower num_blocks \(--num-blocks\)"):
        minikv.LLM(model="tiny-gemma4", backend="torch", num_blocks=8)


@pytest.mark.parametrize("text, value", [("67108864", 2**26), ("64MiB", 2**26), ("64M", 2**26), ("1GiB", 2**30),
                                         ("512k", 2**19)])
def test_byte_counts(text, value):
    assert memory.parse_bytes(text) == value


@pytest.mark.parametrize("args, fragment", [
    (["--num-blocks", "0"], "argument --num-blocks: must be at least 1"),
    (["--block-size", "12"], "argument --block-size: invalid choice: 12"),
    (["--max-model-len", "1"], "argument --max-model-len: must be at least 2"),
    (["--kv-cache-memory-bytes", "lots"], "'lots' is not a byte count"),
    (["--gpu-memory-utilization", "1.5"], "must be a fraction in (0, 1]"),
    (["--max-model-len", "4096"], "max_model_len=4096 is longer than the model's context length 128"),
    (["--max-model-len", "8"], "max_model_len=8"),
])
def test_cli_sizing_errors_are_one_line(capsys, args, fragment):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--backend", "torch", "3 7 11", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "error: " in err and fragment in err, err


def test_cli_sizing_options_reach_the_engine(capsys):
    assert main(["generate", "--backend", "torch", "--temperature", "0", "--num-blocks", "3", "--block-size", "8",
                 "--max-model-len", "24", "--max-tokens", "4", "3 7 11"]) == 0
    assert capsys.readouterr().out.strip() == "'3 7 11' -> ' 15 '  [length]"
    with pytest.raises(SystemExit):
        main(["generate", "--backend", "torch", "--num-blocks", "2", "--block-size", "8", "--max-model-len", "24",
              "3 7 11"])
    assert "num_blocks=2 holds 2 blocks of 8 tokens = 16 tokens; lower max_model_len" in capsys.readouterr().err


@pytest.mark.gpu
def test_on_cuda_the_budget_is_a_share_of_the_device_less_weights_and_activations():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    llm = minikv.LLM(model="tiny-gemma4", device="cuda")
    total = torch.cuda.get_device_properties(0).total_memory
    assert llm.runner.size.budget_source == "gpu_memory_utilization=0.9"
    assert 0 < llm.runner.size.budget_bytes < 0.9 * total and llm.runner.num_blocks == 64     # capped: 8 x 128
    out = llm.generate(["3 7 11 15"], minikv.SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    assert out[0].text.startswith(" 19 23")
    with pytest.raises(ValueError, match="holds no block.*gpu_memory_utilization"):
        minikv.LLM(model="tiny-gemma4", device="cuda", gpu_memory_utilization=1e-6)
