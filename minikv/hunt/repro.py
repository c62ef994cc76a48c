"""A scenario as ready-to-run Python: the `minikv.LLM(...)` call, the prompts, the calls that serve them, and the
check that fails. See docs/internals.md#hunt-repro."""
from __future__ import annotations

import dataclasses

from .scenario import Scenario

_SERVE = '''
def serve(llm, arrivals):
    """arrivals: (step, prompt, max_tokens) per request, step counted from this wave's first engine step.
    Returns each request's token ids, in the order given."""
    pending = sorted(range(len(arrivals)), key=lambda i: arrivals[i][0])
    step, ids, outs = 0, {}, {}
    while pending or llm.has_unfinished():
        while pending and arrivals[pending[0]][0] <= step:
            i = pending.pop(0)
            ids[i] = llm.add_request(arrivals[i][1], minikv.SamplingParams(temperature=0, max_tokens=arrivals[i][2]))
        if not llm.has_unfinished():
            step = arrivals[pending[0]][0]
            continue
        for done in llm.step().finished:
            outs[done.request_id] = done.token_ids
        step += 1
    return [outs[ids[i]] for i in range(len(arrivals))]
'''

TOKEN_ORACLES = ("matches-reference", "schedule-invariant", "repeat-identical")


def _kwargs(kw: dict) -> str:
    parts = []
    for name, value in kw.items():
        if name == "repro":              # a ReproConfig: spelled with the switches that differ from the default
            changed = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)
                       if getattr(value, f.name) != f.default}
            if not changed:
                continue
            text = "minikv.ReproConfig(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"
        else:
            text = f"torch.{value}" if name == "dtype" else repr(value)
        parts.append(f"{name}={text}")
    lines, line = [], "llm = minikv.LLM("
    for p in parts:
        if len(line) + len(p) + 2 > 110:
            lines.append(line.rstrip())
            line = " " * len("llm = minikv.LLM(")
        line += p + ", "
    lines.append(line[:-2] + ")")
    return "\n".join(lines)


def _instrument(instrument, imports: list[str]) -> str | None:
    if instrument is None:
        return None
    module, name = getattr(instrument, "__module__", None), getattr(instrument, "__qualname__", "instrument")
    if module and module != "__main__":
        imports.append(f"import {module}")
        name = f"{module}.{name}"
    return name


def _serving(scenario: Scenario) -> list[str]:
    """The lines that serve every wave, appending each wave's token ids to `waves` and printing them."""
    body = ["waves = []                      # per wave: each request's token ids, in request order"]
    timed = any(r.arrival for r in scenario.requests)
    for wave in range(2 if scenario.repeat else 1):
        if wave and scenario.sleep:
            body += [f"llm.sleep(mode={scenario.sleep!r})", "llm.wake_up()"]
        if timed:
            arrivals = ", ".join(f"({r.arrival}, {r.prompt!r}, {r.max_tokens})" for r in scenario.requests)
            body.append(f"waves.append(serve(llm, [{arrivals}]))")
        else:
            prompts = ", ".join(repr(r.prompt) for r in scenario.requests)
            params = ", ".join(f"minikv.SamplingParams(temperature=0, max_tokens={r.max_tokens})" for r in scenario.requests)
            body.append(f"outs = llm.generate([{prompts}], [{params}], use_tqdm=False)")
            body.append("waves.append([o.token_ids for o in outs])")
        body.append("print(waves[-1])")
    return body


def _token_check(v, scenario: Scenario) -> list[str]:
    wave, index = v.seen_at
    prompt = scenario.requests[index].prompt
    if v.expected is not None:
        what = f"the dense model's greedy tokens for request {index} ({prompt!r}), with the same KV quantization"
        expected = repr(list(v.expected))
    else:
        ew, ei = v.expected_at
        what = (f"request {index} in wave {wave} must give the tokens of request {ei} in wave {ew} "
                f"({'the same request, submitted again' if ei == index else 'a copy of it'})")
        expected = f"waves[{ew}][{ei}]"
    return [f"# invariant {v.oracle}: {what}",
            f"expected, seen = {expected}, waves[{wave}][{index}]",
            f"print({v.oracle + ': expected'!r}, expected, repr(llm.tokenizer.decode(expected)))",
            f"print({v.oracle + ': seen    '!r}, seen, repr(llm.tokenizer.decode(seen)))",
            "failed = failed or seen != expected"]


def _indent(lines: list[str]) -> list[str]:
    return ["    " + line if line else line for line in lines]


def snippet(scenario: Scenario, llm_kwargs: dict, instrument=None, violations=(), replay_call: str | None = None,
            sanitized: bool = False, note: str | None = None) -> str:
    """Python that builds the engine of `scenario` with `llm_kwargs` and serves its requests, printing
    tokens."""
    imports = ["import minikv", "import torch"]
    setup = [_kwargs(llm_kwargs)]
    name = _instrument(instrument, imports)
    if name:
        setup.append(f"{name}(llm)   # the instrument the hunt applied to every engine it built")
    serve = _SERVE.strip("\n").splitlines() + [""] if any(r.arrival for r in scenario.requests) else []
    serving = _serving(scenario)
    if not violations:
        return "\n".join(imports + [""] + serve + setup + serving)
    imports.insert(0, "import sys")
    checks = [v for v in violations if v.oracle in TOKEN_ORACLES and v.seen_at is not None]
    raises = [v for v in violations if v.oracle == "runs"]
    body = ([note] if note else []) + list(setup)
    if sanitized or raises:
        what = ("every byte a step writes lies in a row its slot mapping names: no guard zone written"
                if sanitized else "the configuration runs to completion")
        catch = "minikv.KVCacheOverrunError" if sanitized else "Exception"
        body += ["try:"] + _indent(serving) + [
            f"except {catch} as err:",
            f"    print('expected: {what}')",
            "    print('seen:    ', type(err).__name__, err)"]
        if sanitized:
            body.append("    print('guard hit: after pool', repr(err.pool), 'arena bytes', (err.guard_start, "
                        "err.guard_end))")
        body += ["    sys.exit(1)", "print('expected and seen agree: no overrun')" if sanitized
                 else "print('it ran to completion')"]
        if not checks:
            body.append("sys.exit(0)")
    else:
        body += serving
    if checks:
        body.append("failed = False")
        for v in checks:
            body += _token_check(v, scenario)
        body.append("sys.exit(1 if failed else 0)")
    elif not (sanitized or raises):
        imports.insert(2, "import minikv.hunt")
        body += ["# the check the program cannot make itself: the hunter's own adapter and oracle, on this scenario",
                 f"sys.exit({replay_call})"]
    return "\n".join(imports + [""] + serve + body)
