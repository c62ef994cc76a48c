"""The `minikv` command: generation, the defect registry, and both reproductions' exit status (0 only when the
buggy runs show the upstream signatures and every fixed run is correct)."""
from __future__ import annotations

from minikv.cli import main


def test_generate_prints_right_continuations(capsys):
    assert main(["generate", "--model", "tiny-kvshare", "--backend", "torch", "3 7 11", "10 20 30"]) == 0
    out = capsys.readouterr().out
    assert "' 15 19 23 27'" in out and "' 40 50 60 70'" in out


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


import pytest

import minikv


@pytest.mark.parametrize("argv,fragment", [
    (["eval", "--n", "0"], "--n: must be at least 1"),
    (["generate", "--model", "nope", "3"], "unknown model 'nope'"),
    (["generate", "--backend", "torch", "3X"], "not in the tokenizer's alphabet"),
    (["generate", "--backend", "torch", "--max-tokens", "500", "3 7"], "lower max_tokens"),
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
