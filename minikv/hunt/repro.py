"""A scenario as ready-to-run Python: the `minikv.LLM(...)` call, the prompts, and the calls that serve them."""
from __future__ import annotations

import dataclasses

from .scenario import Scenario

_SERVE = '''
def serve(llm, arrivals):
    """arrivals: (step, prompt, max_tokens), step counted from this wave's first engine step."""
    pending, step, ids, outs = sorted(arrivals, key=lambda a: a[0]), 0, [], {}
    while pending or llm.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, n = pending.pop(0)
            ids.append(llm.add_request(prompt, minikv.SamplingParams(max_tokens=n)))
        if not llm.has_unfinished():
            step = pending[0][0]
            continue
        for done in llm.step().finished:
            outs[done.request_id] = done.token_ids
        step += 1
    return [outs[i] for i in ids]   # in order of arrival
'''


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


def snippet(scenario: Scenario, llm_kwargs: dict, instrument=None) -> str:
    """Python that builds the engine of `scenario` with `llm_kwargs` and serves its requests, printing tokens.
    With `instrument` (the callable the hunt applied to every engine), the snippet applies it too."""
    imports, body = ["import minikv", "import torch"], [_kwargs(llm_kwargs)]
    if instrument is not None:
        module, name = getattr(instrument, "__module__", None), getattr(instrument, "__qualname__", "instrument")
        if module and module != "__main__":
            imports.append(f"import {module}")
            name = f"{module}.{name}"
        body.append(f"{name}(llm)   # the instrument the hunt applied to every engine it built")
    timed = any(r.arrival for r in scenario.requests)
    for wave in range(2 if scenario.repeat else 1):
        if wave and scenario.sleep:
            body += [f"llm.sleep(mode={scenario.sleep!r})", "llm.wake_up()"]
        if timed:
            arrivals = ", ".join(f"({r.arrival}, {r.prompt!r}, {r.max_tokens})" for r in scenario.requests)
            body.append(f"print(serve(llm, [{arrivals}]))")
        else:
            prompts = ", ".join(repr(r.prompt) for r in scenario.requests)
            params = ", ".join(f"minikv.SamplingParams(max_tokens={r.max_tokens})" for r in scenario.requests)
            body.append(f"outs = llm.generate([{prompts}], [{params}], use_tqdm=False)")
            body.append("print([o.token_ids for o in outs])")
    serve = _SERVE.strip("\n").splitlines() + [""] if timed else []
    return "\n".join(imports + [""] + serve + body)
