"""Progress bars come after the inputs are checked (a damaged checkpoint is one error line, never a 0% bar and then
the error), and a library warning raised while a bar runs is shown once, after the bar (minikv.engine.progress)."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import warnings

import pytest

import minikv
from minikv.engine.progress import held_warnings
from minikv.models.registry import WEIGHTS_DIR
from minikv.repro.cross_stride.report import context_runs
from minikv.repro.cross_stride.run import make_prompts, references

FALLBACK = "the context step falls back to the unfused path"


def _truncated(tmp_path, name: str):
    path = tmp_path / name
    shutil.copytree(WEIGHTS_DIR / name, path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("command, model", [(["repro", "scale-wipe"], "tiny-gemma4"),
                                            (["repro", "cross-stride"], "tiny-t5"),
                                            (["hunt", "--budget", "5"], "tiny-gemma4")])
def test_a_truncated_checkpoint_is_one_line_before_any_bar(tmp_path, command, model):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}    # bars on, as a user sees them
    done = subprocess.run([sys.executable, "-m", "minikv", *command, "--model", str(_truncated(tmp_path, model))],
                          capture_output=True, text=True, env=env | {"OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("minikv: error: cannot read ") and "incomplete" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "%|" not in done.stderr, done.stderr
    with pytest.raises(minikv.MinikvError, match="cannot read"):
        minikv.LLM(model=str(tmp_path / model), backend="torch")


@pytest.fixture
def minikv_to_stderr(capsys):
    """minikv's log records written to sys.stderr (pytest's capture), where the bars are drawn too."""
    class ToStderr(logging.Handler):                         # the sys.stderr of the moment, as tqdm writes
        def emit(self, record):
            sys.stderr.write(self.format(record) + "\n")
    handler = ToStderr()
    logger = logging.getLogger("minikv")
    logger.addHandler(handler)
    yield
    logger.removeHandler(handler)


def test_the_context_path_warning_comes_once_after_its_bar(capsys, minikv_to_stderr):
    prompts = make_prompts(2)
    need = minikv.LLM(model="tiny-t5", kv_cache_dtype="fp8", backend="torch").cross_blocks_needed(prompts)
    _, fixed_fp8, _ = references(prompts, need, backend="torch")
    capsys.readouterr()
    context_runs(prompts, fixed_fp8, progress=True)         # the fallback engine logs its configuration warning
    err = capsys.readouterr().err
    assert err.count(FALLBACK) == 1 and f"{FALLBACK} (and 2 more like it)" in err, err     # one per decoder layer
    assert "context paths: 100%" in err and err.rindex("%|") < err.index(FALLBACK), err


def test_held_warnings_emit_each_distinct_one_once_at_the_end(capsys, minikv_to_stderr):
    log = logging.getLogger("minikv.attention.cross")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with held_warnings():
            for _ in range(3):
                log.warning("layer 0: a configuration warning")
                warnings.warn("a library warning", UserWarning)
            log.warning("%s: a warning per layer", "layer 1")
            log.warning("%s: a warning per layer", "layer 2")
            sys.stderr.write("[bar]\n")
            assert not shown
    err = capsys.readouterr().err
    assert err == ("[bar]\nlayer 0: a configuration warning\n"
                   "layer 1: a warning per layer (and 1 more like it)\n")
    assert [str(w.message) for w in shown] == ["a library warning"]
