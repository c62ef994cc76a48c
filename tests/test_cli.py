"""The `minikv` command: generation, the defect registry, and both reproductions' exit status (0 only when the
buggy runs show the upstream signatures and every fixed run is correct). Usage errors: test_inputs.py."""
from __future__ import annotations

import pytest

import minikv
from minikv.cli import main


def test_generate_prints_right_continuations(capsys):
    task = minikv.tasks.for_model("tiny-gemma4")
    prompts = task.prompts(2, seed=0)
    assert main(["generate", "--model", "tiny-gemma4", "--backend", "torch", "--temperature", "0", *prompts]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for prompt, line in zip(prompts, lines):
        shown_prompt, rest = line.split(" -> ")
        assert shown_prompt == repr(prompt) and rest.endswith("[length]")
        assert task.check(prompt, eval(rest.removesuffix("  [length]")))      # the printed repr of the text


def test_bugs_lists_every_defect(capsys):
    assert main(["bugs"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("scale-wipe", "cross-stride", "cross-fp8-context-read"))


def test_repro_scale_wipe_passes(capsys):
    # The smallest grid the command takes (its whole grid and extra tables: notebook 03 and test_scale_wipe.py).
    assert main(["repro", "scale-wipe", "--max-num-seqs", "4", "--requests", "8", "--formats", "int8_per_token_head",
                 "--skip-extras"]) == 0
    out = capsys.readouterr().out
    assert "All upstream signatures reproduced" in out and "int8_per_token_head" in out


# `minikv repro cross-stride` runs in test_cross_stride.py (its results file, written through the command).


def test_version_and_bench_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"minikv {minikv.__version__}"
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("kernels", "attention", "engine"))


def test_generate_samples_as_vllm_by_default_and_takes_its_options(capsys):
    base = ["generate", "--model", "tiny-gemma4", "--backend", "torch", "3 7 11 15"]
    assert main(base + ["--temperature", "0", "--stop", " 27"]) == 0
    assert capsys.readouterr().out.splitlines() == ["'3 7 11 15' -> ' 19 23'  [stop]"]
    sampled = base + ["--temperature", "3", "--top-k", "4", "--top-p", "0.9", "--min-p", "0.01", "--seed", "5",
                      "--n", "3", "--max-tokens", "6"]
    assert main(sampled) == 0
    first = capsys.readouterr().out.splitlines()
    assert len(first) == 3 and all(line.startswith("'3 7 11 15' -> ") for line in first)
    assert main(sampled) == 0 and capsys.readouterr().out.splitlines() == first       # seeded: the same again
    assert main(base + ["--temperature", "0", "--ids"]) == 0
    generated = capsys.readouterr().out.split(" -> ")[1].removesuffix("  [length]\n")
    assert len(eval(generated)) == minikv.SamplingParams().max_tokens == 16          # the same default as Python's
