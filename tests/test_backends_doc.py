"""docs/backends.md's example adapter, run as the page prints it: about 40 lines, an AttentionBackend, clean under
the backend hunt, and inside minikv's models it gives the torch backend's tokens (Gemma-4's sliding windows and
KV-sharing layers, T5's relative bias and cross pools)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import minikv
from minikv.attention.protocol import AttentionBackend
from minikv.hunt.backend_hunt import hunt_backend

PAGE = Path(__file__).resolve().parents[1] / "docs" / "backends.md"


def example_source() -> str:
    text = PAGE.read_text()
    match = re.search(r"<!-- example-adapter -->\n```python\n(.*?)\n```\n", text, re.DOTALL)
    assert match, "docs/backends.md lost its marked example adapter"
    return match.group(1)


@pytest.fixture(scope="module")
def loop_backend():
    namespace = {"__name__": "backends_doc_example"}
    exec(compile(example_source(), str(PAGE), "exec"), namespace)   # noqa: S102 -- the page's code, as printed
    return namespace["LoopBackend"]


def test_the_example_is_about_forty_lines(loop_backend):
    assert 30 <= len(example_source().splitlines()) <= 45
    assert isinstance(loop_backend(), AttentionBackend)


def test_the_example_hunts_clean(loop_backend):
    report = hunt_backend(loop_backend(), budget_s=None, max_scenarios=64)
    assert not report.found, report.text()
    assert {f.outcome for f in report.families} == {"pass"}


@pytest.mark.parametrize("model,fmt", [("tiny-gemma4", "fp8_per_token_head"), ("tiny-t5", "auto")])
def test_the_example_runs_inside_minikvs_models(loop_backend, model, fmt):
    outs = []
    for backend in ("torch", loop_backend()):
        llm = minikv.LLM(model=model, kv_cache_dtype=fmt, backend=backend, max_num_seqs=2, block_size=8)
        prompts = llm.task.prompts(3, seed=2)
        outs.append([o.token_ids for o in llm.generate(prompts, minikv.SamplingParams(max_tokens=5),
                                                       use_tqdm=False)])
    assert outs[0] == outs[1]
