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
