"""`minikv demo` (the main job, `make run`): it ends, within one terminal screen, with each defect reproduced and
fixed in a few lines, and names the notebook that explains it. Runs on CPU with the torch backend (~10 s)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from minikv.cli import demo

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def output() -> str:
    import contextlib
    import io
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert demo.main(device="cpu") == 0
    return buffer.getvalue()


def _section(output: str, start: str) -> str:
    return output[output.index(start):]


def test_story_fits_one_screen(output):
    story = _section(output, "2. Defect A").rstrip("\n").splitlines()
    assert len(story) <= 30, f"the defect story takes {len(story)} lines:\n" + "\n".join(story)
    assert max(len(line) for line in output.splitlines()) <= 120


def test_scale_wipe_damages_exactly_the_first_batch_and_the_fix_matches_the_reference(output):
    story = _section(output, "2. Defect A")
    assert "requests 0-3 of 8 wrong = exactly the first scheduled batch" in story
    # Gemma-4's topology, upstream's census: the first sharer of each shared cache wipes it, the second finds 1.0
    assert "first KV-sharing layer to touch each shared cache (layers 4, 5) built its scale views" in story
    assert "late (step 0)" in story and "scales layers 2, 3" in story
    assert re.search(r"census: \d+ fills, \d+ wiping nothing \(warmup, and the later sharers 6, 7 at step 0\), "
                     r"2 wiping written scales", story)
    assert re.search(r"K dequantize x\d+ too large", story)
    assert "fixed  8 of 8 right; 8 of 8 token ids identical to the 16-bit-cache (auto) reference" in story


def test_cross_stride_and_context_read_reproduced_and_fixed(output):
    story = _section(output, "3. Defect B")
    assert "layout contract on:  KVLayoutMismatchError at bind" in story
    assert "sanitizer on:        KVCacheOverrunError: guard zone after 'cross.decoder.0.cross_attn'" in story
    silent = re.search(r"sanitizer off: +requests (\S.*) of 6 wrong, silently", story)
    assert silent and silent.group(1) != "none"
    assert re.search(r"B2 buggy.*: requests 0-5 of 6 wrong", story)
    assert story.count("6 of 6 token ids identical to the auto-cache reference") == 2
    assert "(unexpected)" not in output


def test_points_to_notebooks_and_docs_that_exist(output):
    pointers = re.findall(r"explained in (\S+) and (\S+)", output)
    assert [p[0] for p in pointers] == ["notebooks/03_kv_sharing_scale_wipe.ipynb",
                                        "notebooks/04_cross_attention_stride_doubling.ipynb"]
    for path in (path for pair in pointers for path in pair):
        assert (REPO / path).exists(), f"the demo points to {path}, which does not exist"


def test_prints_nothing_that_depends_on_the_last_bits_of_a_float(output):
    assert not re.search(r"\d\.\d{3,}|e-0[4-9]|e-[1-9]\d", output), output


def test_ranges():
    assert demo._ranges([0, 1, 2, 3, 5]) == "0-3, 5"
    assert demo._ranges([]) == "none"
    assert demo._ranges([7]) == "7"
