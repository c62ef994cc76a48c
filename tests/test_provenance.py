"""Provenance: every upstream number, date and state lives in minikv/defects/provenance.py; the pages render it.

The records there come from the reduced upstream texts (shared/upstream/*.md, outside the repository) and, for
what those do not give, the public threads as of `provenance.CHECKED`. Checked here: every issue or pull request
number cited in README, docs, notebooks and the defect registry is one the data file records; no page states a
pull request's state other than the recorded one; the defect pages and notebooks 03/04 show the box rendered from
the data (the recorded notebook outputs equal today's rendering); and no sentence repeats a claim upstream has
since revised without saying whose claim it was.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from minikv import bugs
from minikv.defects import provenance

REPO = Path(__file__).resolve().parents[1]
CITE = re.compile(r"(?:\bPR\s*#?|\bissues?\s*#?|\bpull requests?\s*#?|(?<![\w#])#)(\d{4,6})\b")
PROSE = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "notebooks").glob("*.py"),
                REPO / "minikv" / "defects" / "registry.py", REPO / "minikv" / "cli" / "demo.py",
                REPO / "minikv" / "cli" / "__init__.py"])
PAGES = {"scale-wipe": ("docs/defects/scale-wipe.md", "notebooks/03_kv_sharing_scale_wipe"),
         "cross-stride": ("docs/defects/cross-stride-fp8-context.md", "notebooks/04_cross_attention_stride_doubling")}


def _ids(p: Path) -> str:
    return str(p.relative_to(REPO))


def _sentences(text: str) -> list[str]:
    flat = re.sub(r"\s*\n\s*#?\s*", " ", text)            # join wrapped lines (and .py comment lines)
    return re.split(r"(?<=[.;:!?])\s+(?=[A-Z(*`\[])", flat)


@pytest.mark.parametrize("path", PROSE, ids=_ids)
def test_only_numbers_the_data_file_records_are_cited(path):
    cited = {int(m.group(1)) for m in CITE.finditer(path.read_text())}
    unknown = cited - provenance.numbers()
    assert not unknown, f"{path.name} cites {sorted(unknown)}, which minikv/defects/provenance.py does not record"


# A state word right after a pull request's number ("#51061 (closed)", "#51091, open as of ...").
STATED = re.compile(r"#(\d{4,6})\b[^.;#\n]{0,40}?\b(merged|closed|open)\b")


def wrong_states(text: str) -> list[str]:
    """Each pull request called merged, closed or open other than the data file records it (link targets and
    line breaks removed first, so "[#51061](https://...) (closed)" reads as "#51061 (closed)")."""
    flat = re.sub(r"\]\([^)]*\)", "]", re.sub(r"\s*\n\s*#?\s*", " ", text))
    wrong = []
    for m in STATED.finditer(flat):
        try:
            recorded = provenance.step(int(m.group(1)), "pull request")
        except KeyError:
            continue
        state = (recorded.state or "").split()
        if not state or m.group(2) != state[0]:
            wrong.append(f"#{m.group(1)} called {m.group(2)}, recorded {recorded.state!r}: {m.group(0)}")
    for sentence in _sentences(text):
        for number in {int(n) for n in re.findall(r"#(\d{4,6})\b", sentence)}:
            try:
                recorded = provenance.step(number, "pull request")
            except KeyError:
                continue
            if re.search(r"\bmerged\b", sentence) and "merged" not in (recorded.state or "") \
                    and "not merged" not in sentence and "merge state" not in sentence:
                wrong.append(f"#{number} called merged: {sentence[:160]}")
    return wrong


@pytest.mark.parametrize("path", PROSE, ids=_ids)
def test_no_page_states_another_state(path):
    """A pull request is called merged, closed or open only as the data file records it."""
    wrong = wrong_states(path.read_text())
    assert not wrong, f"{path.name}:\n" + "\n".join(wrong)


def test_the_state_check_can_fail():
    assert wrong_states("The fix, [#51091](https://github.com/vllm-project/vllm/pull/51091) (closed), ...")
    assert wrong_states("Pull request #51061 was merged in August.")
    assert wrong_states("TensorRT-LLM #20958, merged")          # its merge state is not recorded
    assert not wrong_states("[#51091](https://x.y/51091), open as of 2026-12-02, after #51061 (closed).")


REVISED = [
    # (pattern, what a sentence with it must also say): claims of the first vLLM pull request that its successor
    # revised, and phrasings that turned an inference into a fact.
    (re.compile(r"root cause", re.I), re.compile(r"#51061|first pull request|closed")),
    (re.compile(r"never run", re.I), re.compile(r"minikv's (reading|guess)")),
    (re.compile(r"no vLLM test", re.I), re.compile(r"minikv's (reading|guess)")),
    (re.compile(r"which is why upstream", re.I), re.compile(r"(?!)")),
    (re.compile(r"number (is )?not (part of|given)", re.I), re.compile(r"(?!)")),
]


@pytest.mark.parametrize("path", PROSE, ids=_ids)
def test_revised_claims_are_attributed(path):
    bad = [f"{sentence[:200]}" for sentence in _sentences(path.read_text()) for claim, needs in REVISED
           if claim.search(sentence) and not needs.search(sentence)]
    assert not bad, f"{path.name}: a claim upstream revised, or an inference, stated as a fact:\n" + "\n".join(bad)


def test_the_records_are_complete():
    for name, steps in provenance.TIMELINES.items():
        assert name in bugs.DEFECTS and name in provenance.READING
        for step in steps:
            assert step.said and len(step.said) < 400, step
            assert step.url.startswith(("https://github.com/vllm-project/vllm/", "https://github.com/NVIDIA/"))
            assert step.date is None or re.fullmatch(r"(on or before )?\d{4}-\d{2}-\d{2}", step.date), step.date
    wipe = {s.number: s for s in provenance.SCALE_WIPE}
    assert wipe[51061].state == "closed" and wipe[51091].state == "open"        # as of provenance.CHECKED
    assert [s.kind for s in provenance.SCALE_WIPE].count("pull request") == 2
    assert any(s.kind == "review" for s in provenance.CROSS_FP8)


def test_box_renders_every_step_and_labels_the_reading():
    for name, steps in provenance.TIMELINES.items():
        box = provenance.box_markdown(name)
        assert box.startswith("**What upstream said, and when**") and provenance.CHECKED in box
        for step in steps:
            assert step.url in box and step.said in box and (step.state or "not recorded") in box
        assert "**minikv's reading** (not upstream's)" in box
        assert all(line in box for line in provenance.READING[name])


def test_registry_renders_from_the_data():
    for name in bugs.DEFECTS:
        assert bugs.DEFECTS[name].upstream_reference.startswith(provenance.reference(name))
    ref = bugs.DEFECTS["scale-wipe"].upstream_reference
    assert "#51091 (open as of" in ref and "#50702" in ref and "#50749" in ref
    assert "#20958" in bugs.DEFECTS["cross-stride"].upstream_reference


@pytest.mark.parametrize("name", sorted(PAGES))
def test_defect_page_carries_the_box(name):
    page = (REPO / PAGES[name][0]).read_text()
    head = page.split("\n## ", 1)[0]
    assert f"<!-- provenance: {name} -->" in head, f"{PAGES[name][0]}: no provenance box before its first section"
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "tools" / "docs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    box = hooks.provenance_box(name)
    assert box.startswith('!!! info "What upstream said, and when"')
    assert all(s.url in box for s in provenance.TIMELINES[name])


@pytest.mark.parametrize("name", sorted(PAGES))
def test_notebook_shows_the_box_rendered_from_the_data(name):
    """The notebook calls provenance.show in its first code cell, and its recorded output is today's box."""
    stem = PAGES[name][1]
    assert f'provenance.show("{name}")' in (REPO / f"{stem}.py").read_text()
    cells = json.loads((REPO / f"{stem}.ipynb").read_text())["cells"]
    first = next(c for c in cells if c["cell_type"] == "code")
    shown = ["".join(o["data"]["text/markdown"]) for o in first.get("outputs", [])
             if "text/markdown" in o.get("data", {})]
    assert shown == [provenance.box_markdown(name)], (
        f"{stem}.ipynb's first code cell does not show today's box: re-execute the notebook")
