"""The `minikv` command: generation, the defect registry, and both reproductions' exit status (0 only when the
buggy runs show the upstream signatures and every fixed run is correct)."""
from __future__ import annotations

import pytest

import minikv
from minikv.cli import main


def test_generate_prints_right_continuations(capsys):
    task = minikv.tasks.for_model("tiny-gemma4")
    prompts = task.prompts(2, seed=0)
    assert main(["generate", "--model", "tiny-gemma4", "--backend", "torch", *prompts]) == 0
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
    assert main(["repro", "scale-wipe", "--max-num-seqs", "4", "6", "--requests", "16"]) == 0
    assert "All upstream signatures reproduced" in capsys.readouterr().out


def test_repro_cross_stride_passes(capsys):
    assert main(["repro", "cross-stride"]) == 0
    out = capsys.readouterr().out
    assert "overrun caught" in out and "All signatures reproduced" in out



@pytest.mark.parametrize("argv,fragment", [
    (["eval", "--n", "0"], "--n: must be at least 1"),
    (["generate", "--model", "nope", "3"], "invalid choice: 'nope'"),
    (["generate", "--backend", "torch", "3X"], "not in the tokenizer's alphabet"),
    (["generate", "--backend", "torch", "--max-tokens", "500", "3 7"], "lower max_tokens"),
    (["generate", "--backend", "torch", "5000 6000"], "'5000 6000' is outside tiny-gemma4's domain: first term 0..999"),
    (["generate", "--backend", "torch", "9 5 1"], "outside tiny-gemma4's domain"),
    (["generate", "--model", "tiny-t5", "--backend", "torch", "abc"], "'abc' is outside tiny-t5's domain: 4..40"),
    (["train", "tiny-gpt"], "invalid choice"),
    (["bench", "nope"], "invalid choice"),
])
def test_user_errors_print_one_line_and_exit_2(capsys, argv, fragment):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("minikv")


def test_version_and_bench_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"minikv {minikv.__version__}"
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("kernels", "attention", "engine"))
