"""What upstream said about each reproduced defect, and when: the one source of every upstream number and state.
See docs/internals.md#defects-provenance."""
from __future__ import annotations

from dataclasses import dataclass

CHECKED = "2026-12-02"   # the day the upstream states below were last checked

VLLM = "https://github.com/vllm-project/vllm"
TRTLLM = "https://github.com/NVIDIA/TensorRT-LLM"


@dataclass(frozen=True)
class Step:
    """One upstream step: an issue, a pull request, or a review round on one."""
    repo: str            # "vllm-project/vllm" or "NVIDIA/TensorRT-LLM"
    kind: str            # "issue", "pull request", "review", or "reference" (issue or pull request, not said)
    number: int
    title: str | None    # as published, where the sources give it
    date: str | None     # YYYY-MM-DD (opened), or "on or before YYYY-MM-DD"; None: not recorded
    state: str | None    # "open", "closed", "closed (not merged)", ...; None: not recorded
    said: str            # what it said, in one line of minikv's own words

    @property
    def url(self) -> str:
        base = VLLM if self.repo == "vllm-project/vllm" else TRTLLM
        return f"{base}/{'pull' if self.kind in ('pull request', 'review') else 'issues'}/{self.number}"

    @property
    def short(self) -> str:
        """`vLLM #51091`, `TensorRT-LLM #20958`."""
        return f"{'vLLM' if self.repo == 'vllm-project/vllm' else 'TensorRT-LLM'} #{self.number}"


# Defect A: vLLM's per-token-head scale wipe on KV-sharing layers.
SCALE_WIPE = (
    Step("vllm-project/vllm", "issue", 50702, None, "on or before 2026-08-04", None,
         "Reports wrong output with a per-token-head KV cache on Gemma-4 under conditions that looked unrelated "
         "(batch geometry, prefix caching, prompt length), as #51061 summarizes it."),
    Step("vllm-project/vllm", "issue", 50749, None, "on or before 2026-08-04", None,
         "A second report of that kind, cited together with #50702 by both pull requests."),
    Step("vllm-project/vllm", "pull request", 51061, None, "2026-08-04", "closed",
         "Describes the wipe (a sharing layer's first scale fill resets the scales its target layer just wrote), "
         "proposes a fix (a per-storage registry), and calls it the likely root cause of #50702 and #50749."),
    Step("vllm-project/vllm", "pull request", 51091,
         "[Bugfix] Initialize per-token-head KV scale regions once per storage", "2026-08-05", "open",
         "Proposes the same fix; its author now calls the wipe real but distinct from the primary failures those "
         "two issues report."),
)

# Defect B (B1 cross-stride and B2 cross-fp8-context-read): TensorRT-LLM's FP8 cross-attention cache.
CROSS_FP8 = (
    Step("NVIDIA/TensorRT-LLM", "issue", 19861, None, None, None,
         "flan-t5-base with an FP8 KV cache on the PyTorch backend: a 768-block cross pool crashed, and the first "
         "of identical requests decoded differently (as #20958 quotes the issue's table)."),
    Step("NVIDIA/TensorRT-LLM", "pull request", 20958,
         "[#19861][fix] Fix FP8 KV cache for cross attention on the PyTorch backend", None, None,
         "Closes #19861 with two fixes (quant config passed to the cross-attention backend; the unfused context "
         "path for quantized cross attention) and lets the backend matrix run FP8 cross cases; validated on one "
         "L4, lint- and type-checked only on main."),
    Step("NVIDIA/TensorRT-LLM", "review", 20958, None, None, "left open",
         "Reviewers ask for a small-pool FP8 cross case (enough blocks, fewer than twice) and a repeated-request "
         "check at the integration layer; the author answers that the matrix cannot show the first and offers "
         "a modeling test for the second if wanted."),
)

TIMELINES: dict[str, tuple[Step, ...]] = {
    "scale-wipe": SCALE_WIPE,
    "cross-stride": CROSS_FP8,
    "cross-fp8-context-read": CROSS_FP8,
}

# Also named by the upstream texts: (heading, ((step, why), ...)). Kind "reference": the texts do not say whether
# it is an issue or a pull request (GitHub's /issues/N address opens either).
RELATED: dict[str, tuple[str, tuple[tuple[Step, str], ...]]] = {
    "scale-wipe": ("Not this defect", (
        (Step("vllm-project/vllm", "pull request", 48842, None, None, None, ""),
         "an unrelated int4 startup crash on the same models"),
        (Step("vllm-project/vllm", "reference", 49716, None, None, None, ""),
         "a different `_ensure_scale_caches` defect: scale views built from the tensor's shape instead of its "
         "strides, on padded pages"),
    )),
    "cross-stride": ("Also named", (
        (Step("NVIDIA/TensorRT-LLM", "reference", 17558, None, None, None, ""),
         "which deleted the C++ file the fallback used to be in (#20958 puts it in thop/attentionOp.cpp)"),
    )),
}
RELATED["cross-fp8-context-read"] = RELATED["cross-stride"]

# What minikv adds: its own reading, never upstream's word.
READING: dict[str, tuple[str, ...]] = {
    "scale-wipe": (
        "The defect is real and minikv reproduces it with upstream's signatures (the whole first batch damaged, "
        "K inflated by 1 / true scale, 2 wiping fills against 33 harmless ones on a model with gemma-4-E2B's topology).",
        "Whether it explains #50702 and #50749: upstream's latest word (#51091) is that it is real but distinct "
        "from the primary failures they report; minikv "
        "cannot test those reports.",
        f"The fix is proposed, not merged, as of {CHECKED}.",
        "Nothing upstream says which test would have caught it; minikv's guess is a check that a request's KV "
        "bytes are the same in the first batch and a later one (the comparison #51061's evidence makes).",
    ),
    "cross-stride": (
        "Both defects are real and minikv reproduces them (B1's 2x pool threshold, B2's wrong context step with "
        "correct decode steps), together with the two regression cases the reviewers asked for.",
        "The merge state of #20958 is not in the texts minikv works from.",
        "That the \"no fp8 cross\" filter is why nothing caught them before is minikv's reading of the PR, "
        "which removed the filter and found 14 cases failing on the fused path.",
    ),
}
READING["cross-fp8-context-read"] = READING["cross-stride"]


def numbers() -> set[int]:
    """Every upstream issue and pull request number recorded here."""
    steps = [s for t in TIMELINES.values() for s in t] + [s for _, r in RELATED.values() for s, _ in r]
    return {s.number for s in steps}


def step(number: int, kind: str | None = None) -> Step:
    """The recorded step with this number (the issue or pull request itself, not its review)."""
    for s in [s for t in TIMELINES.values() for s in t]:
        if s.number == number and s.kind != "review" and (kind is None or s.kind == kind):
            return s
    raise KeyError(number)


def _cell(value: str | None) -> str:
    return value if value else "not recorded"


def box_markdown(defect: str) -> str:
    """The "What upstream said, and when" box of a defect, as Markdown (a heading, a table, minikv's reading)."""
    steps = TIMELINES[defect]
    lines = ["**What upstream said, and when** "
             f"(states as of {CHECKED}; dates and states the sources do not give are \"not recorded\")", "",
             "| date | step | state | what it said (minikv's summary) |", "|---|---|---|---|"]
    for s in steps:
        # Brackets escaped: "[#19861][fix]" would otherwise be read as a Markdown reference link.
        title = f" \"{s.title.replace('[', chr(92) + '[').replace(']', chr(92) + ']')}\"" if s.title else ""
        lines.append(f"| {_cell(s.date)} | {s.kind} [{s.short}]({s.url}){title} | {_cell(s.state)} | {s.said} |")
    heading, related = RELATED.get(defect, ("", ()))
    if related:
        lines += ["", f"{heading}: " + "; ".join(f"[{s.short}]({s.url}), {why}" for s, why in related) + "."]
    lines += ["", "**minikv's reading** (not upstream's):", ""]
    lines += [f"- {line}" for line in READING[defect]]
    return "\n".join(lines)


def reference(defect: str) -> str:
    """One line for `minikv bugs`: the pull request that carries the fix and its state, and the issue(s)."""
    steps = TIMELINES[defect]
    prs = [s for s in steps if s.kind == "pull request"]
    issues = [s for s in steps if s.kind == "issue"]
    fix = prs[-1]
    state = f"{fix.state} as of {CHECKED}" if fix.state else "merge state not in the texts minikv works from"
    engine, number = fix.short.split(" ")
    text = f"{engine} pull request {number} ({state})"
    if defect == "scale-wipe":
        return (f"{text}, after the closed #{prs[0].number}; issues "
                f"{' and '.join('#%d' % s.number for s in issues)} (#{fix.number} calls the wipe distinct from their primary failures)")
    return f"{text}, closing issue #{issues[0].number}"


def show(defect: str):
    """Display the box in a notebook (an IPython Markdown object; plain text where IPython is missing)."""
    try:
        from IPython.display import Markdown, display
    except ImportError:      # pragma: no cover - outside Jupyter
        print(box_markdown(defect))
        return
    display(Markdown(box_markdown(defect)))
