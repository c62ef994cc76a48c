"""The hunter's parts one at a time: each oracle fires on a record that breaks it and stays quiet otherwise, the
adapter's byte diff names stray writes (guard zones included), the kernel shadow catches a kernel that leaves its
reference, reproductions replay what the adapter ran, and `minikv hunt`'s exit codes."""
from __future__ import annotations

import contextlib
import io
import sys

import pytest
import torch

from minikv import cli
from minikv.hunt import MinikvEngine, Request, Scenario, hunt, oracles
from minikv.hunt.record import KVRow, RequestResult, Run, StrayWrite
from minikv.hunt.reference import Reference
from minikv.hunt.seams import pool_of, wrap_kernel_op
from minikv.hunt.shadow import KernelShadow
from minikv.kernels.formats import BLOCK, V_TRANSPOSED_ABOVE

VOCAB = 6


TOLERANCE = 0.5                     # each row's, in logits: two tokens within twice that are a near tie


def reference(tokens, margin=5.0):
    """A Reference whose token at each position beats every other by `margin` logits."""
    rows = []
    for t in tokens:
        row = torch.zeros(VOCAB)
        row[t] = margin
        rows.append(row)
    return Reference(tuple(tokens), tuple(rows), tolerance=(TOLERANCE,) * len(tokens))


def result(index, tokens, wave=0, schedule=(("prefill", ((0, 0),)),), kv=None, prompt="p", max_tokens=3):
    return RequestResult(index, wave, prompt, max_tokens, tuple(tokens), "length", schedule, kv)


def run_of(*requests, **kw):
    return Run(Scenario("m", "auto"), requests=list(requests), eos_id=VOCAB - 1, **kw)


def names(violations):
    return [v.oracle for v in violations]


def test_matches_reference():
    refs = {"p": reference([1, 2, 3])}
    assert oracles.matches_reference(run_of(result(0, [1, 2, 3])), refs) == []
    bad = oracles.matches_reference(run_of(result(0, [1, 4, 3])), refs)
    assert names(bad) == ["matches-reference"] and "[1, 2, 3]" in bad[0].summary
    assert "[1, 4, 3], first different at token 1" in bad[0].detail
    assert "[1, 4, 3]" not in bad[0].summary            # tokens decoded from damaged memory stay out of it
    assert oracles.matches_reference(run_of(result(0, [1, 4, 3])), {"p": reference([1, 2, 3], 2 * TOLERANCE)}) == []
    assert names(oracles.matches_reference(run_of(result(0, [1, 4, 3])),
                                           {"p": reference([1, 2, 3], 2 * TOLERANCE + 0.1)})) == ["matches-reference"]


def test_matches_reference_counts_an_early_eos():
    refs = {"p": reference([1, 2, 3])}
    early = RequestResult(0, 0, "p", 3, (1,), "eos", (), None)
    assert names(oracles.matches_reference(run_of(early), refs)) == ["matches-reference"]


def test_repeat_identical():
    same = (("prefill", ((0, 0),)),)
    kv = {"kv.a": (KVRow(b"\x01\x02", b"\x00\x00\x80\x3f"),)}
    wiped = {"kv.a": (KVRow(b"\x01\x02", b"\x00\x00\x00\x3c"),)}
    assert oracles.repeat_identical(run_of(result(0, [1, 2], kv=kv), result(0, [1, 2], wave=1, kv=kv)), {}) == []
    tokens = oracles.repeat_identical(run_of(result(0, [1, 2]), result(0, [1, 3], wave=1)), {})
    assert names(tokens) == ["repeat-identical"]
    scales = oracles.repeat_identical(run_of(result(0, [1, 2], kv=kv), result(0, [1, 2], wave=1, kv=wiped)), {})
    assert len(scales) == 1 and "pool kv.a, position 0: scales differ" in scales[0].summary
    other = (("prefill", ((0, 16),)),)                   # a prefix-cache hit: another computation, not compared
    assert oracles.repeat_identical(run_of(result(0, [1, 2], schedule=same, kv=kv),
                                           result(0, [1, 3], wave=1, schedule=other, kv=wiped)), {}) == []


def test_schedule_invariant():
    refs = {"p": reference([1, 2, 3])}
    assert oracles.schedule_invariant(run_of(result(0, [1, 2, 3]), result(1, [1, 2, 3])), refs) == []
    bad = oracles.schedule_invariant(run_of(result(0, [1, 2, 3]), result(1, [1, 2, 4])), refs)
    assert names(bad) == ["schedule-invariant"] and "from token 2" in bad[0].detail
    tie = {"p": reference([1, 2, 3], TOLERANCE)}
    assert oracles.schedule_invariant(run_of(result(0, [1, 2, 3]), result(1, [1, 2, 4])), tie) == []
    assert oracles.schedule_invariant(run_of(result(0, [1, 2, 3]), result(1, [1, 2, 4], prompt="q")), refs) == []


def test_writes_runs_and_kernels():
    stray = run_of(stray_writes=[StrayWrite(0, "guard after kv.a", 3, 2), StrayWrite(1, "pool kv.b", 0, 1)])
    found = oracles.writes_in_bounds(stray, {})
    assert names(found) == ["writes-in-bounds"] and "guard after kv.a" in found[0].summary
    assert "step 0" in found[0].summary and "1 more" in found[0].detail
    assert names(oracles.runs(run_of(error="IndexError: out of range", error_at="step 2"), {})) == ["runs"]
    assert names(oracles.kernels_match_references(run_of(kernel_mismatches=["decode: x"]), {})) == [
        "kernels-match-references"]
    assert oracles.check(run_of(result(0, [1, 2, 3])), {"p": reference([1, 2, 3])}) == []


# ---- the minikv adapter --------------------------------------------------------------------------------------

SMALL = Scenario("tiny-gemma4", "int8_per_token_head", "float32", requests=(Request("389 391 393", 2),))


def write_also(where):
    """An instrument whose cache writer also sets one byte at arena offset `where(llm)`."""
    def instrument(llm):
        def make(write_kv):
            def planted(*args, **kwargs):
                write_kv(*args, **kwargs)
                llm.arena.storage[where(llm)] = 0x11      # neither a canary byte nor an unwritten one
            return planted
        wrap_kernel_op(llm, "write_kv", make)
    return instrument


def test_the_adapter_names_a_write_into_a_guard_zone_and_into_an_unnamed_block():
    assert MinikvEngine().run(SMALL).stray_writes == []
    first = None

    def guard(llm):
        return llm.arena.guards[1][1] + 7                # the guard after the first pool

    def other_block(llm):
        name = next(iter(llm.arena.offsets))
        return llm.arena.offsets[name] + llm.arena.layout(name).block_bytes * 3 + 5   # block 3: nobody's
    for where, region in ((guard, "guard after "), (other_block, "pool ")):
        run = MinikvEngine(instrument=write_also(where)).run(SMALL)
        first = run.stray_writes[0]
        assert first.step == 0 and first.region.startswith(region), run.stray_writes


def test_the_adapter_records_kv_bytes_per_position_with_scales_apart():
    run = MinikvEngine().run(SMALL)
    (res,) = run.requests
    assert res.kv and all(len(rows) == 1 + len("389 391 393") for rows in res.kv.values())
    row = next(iter(res.kv.values()))[0]
    assert len(row.scales) == 2 * 2 * 4 and len(row.codes) == 2 * 2 * 32   # K and V, 2 KV heads, head size 32


def test_the_kernel_shadow_catches_a_kernel_that_leaves_its_reference():
    engine = MinikvEngine()
    llm, shadow = engine.build(SMALL)
    assert shadow is None                                # torch backend: the kernels are the references

    def make(decode):
        return lambda *args, **kwargs: decode(*args, **kwargs) * 1.5
    wrap_kernel_op(llm, "decode", make)
    shadow = KernelShadow(llm)
    llm.generate(["389 391 393"], __import__("minikv").SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert shadow.calls > 0 and shadow.mismatches
    assert all(m.startswith("decode:") for m in shadow.mismatches)


def test_pool_of_names_arena_pools_only():
    llm, _ = MinikvEngine().build(SMALL)
    name = next(iter(llm.arena.offsets))
    assert pool_of(llm, llm.arena.pool(name))[0] == name
    assert pool_of(llm, torch.zeros(4, dtype=torch.uint8)) is None
    with pytest.raises(ValueError, match="kernel ops are"):
        wrap_kernel_op(llm, "matmul", lambda op: op)


def _printed(code: str) -> list:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<snippet>", "exec"), {})
    return [eval(line) for line in out.getvalue().splitlines()]


def test_a_reproduction_replays_arrivals_a_second_wave_and_a_sleep():
    scenario = Scenario("tiny-gemma4", "fp8", "float32", requests=(Request("389 391 393", 3, arrival=0),
                                                                     Request("193 263 333", 2, arrival=2)),
                        max_num_seqs=2, repeat=True, sleep="discard", num_blocks=4)
    engine = MinikvEngine()
    run = engine.run(scenario)
    assert run.error is None and run.refused is None and len(run.requests) == 4
    by_wave = [[list(r.token_ids) for r in run.requests if r.wave == w] for w in (0, 1)]
    assert _printed(engine.snippet(scenario)) == by_wave
    assert run.requests[1].schedule[0][0] == "prefill" and len(run.requests[0].schedule) == 3


# ---- the command line ------------------------------------------------------------------------------------------

def test_cli_exit_codes(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["hunt", "--reintroduce", "cross-stride", "--max-scenarios", "24"]) == 1
    out = capsys.readouterr().out
    assert "FOUND" in out and "invariant writes-in-bounds" in out and "reintroduce=('cross-stride',)" in out
    assert cli.main(["hunt", "--max-scenarios", "2", "--oracle", "runs"]) == 0
    assert capsys.readouterr().out.startswith("clean: 2 scenarios")
    for bad in (["--reintroduce", "no-such-defect"], ["--budget", "0"], ["--budget", "soon"], ["--seed", "-1"],
                ["--oracle", "no-such-oracle"], ["--max-scenarios", "x"],
                ["--reintroduce", "scale-wipe", "cross-stride", "--max-scenarios", "20"]):   # no model takes both
        with pytest.raises(SystemExit) as exit_:
            cli.main(["hunt", *bad])
        assert exit_.value.code == 2, bad
    assert list(tmp_path.iterdir()) == []


def test_cli_without_hypothesis_says_what_to_install(capsys, monkeypatch):
    from minikv.hunt import cli as hunt_cli
    monkeypatch.setitem(sys.modules, "hypothesis", None)      # import hypothesis now raises ImportError
    args = type("Args", (), {"reintroduce": [], "backend": "torch", "seed": 0, "budget": 1.0,
                             "max_scenarios": None, "oracle": None})()
    assert hunt_cli.run(args) == 2
    assert "pip install hypothesis" in capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["auto", "fp8", "int8_per_token_head", "fp8_per_token_head"])
@pytest.mark.parametrize("placement", ["row", "block"])
def test_the_adapters_byte_offsets_are_the_layouts(fmt, placement):
    """The adapter reads the layout's address methods once per layout and extends them linearly: the offsets must
    equal the methods' own for every slot, half and head."""
    from minikv.cache.layout import KVLayout
    from minikv.hunt import minikv_engine
    for heads, block_size, head_size in ((1, 8, 32), (2, 16, 32), (4, 8, 32), (2, 8, 256)):
        layout = KVLayout(fmt, torch.float16, heads, head_size, block_size, placement)
        slots = [0, 3, block_size + 1, 5 * block_size - 1]
        # "block" placement above head size V_TRANSPOSED_ABOVE: V's codes lie a token apart
        step = (1, block_size if layout.spec.placement == BLOCK and head_size > V_TRANSPOSED_ABOVE else 1)
        rows = [layout.row_offset(s // block_size, kv, s % block_size, h) + i * step[kv] for s in slots
                for kv in (0, 1) for h in range(heads) for i in range(layout.code_bytes)]
        assert minikv_engine._row_bytes(layout, slots, scales=False).tolist() == rows
        if layout.has_inline_scales:
            scales = [layout.scale_byte_offset(s // block_size, kv, s % block_size, h) + i for s in slots
                      for kv in (0, 1) for h in range(heads) for i in range(4)]
            assert minikv_engine._scale_bytes(layout, slots).tolist() == scales


class OtherEngine:
    """"Another engine", written against the record interface only: its outputs are made up from the prompt, and
    it has a defect of its own: with 8-token blocks, a batch submitted again gets other scale bytes."""

    def run(self, scenario):
        run = Run(scenario, eos_id=99)
        for wave, requests in enumerate(scenario.waves()):
            for i, r in enumerate(requests):
                scales = b"\x01" if wave and scenario.block_size == 8 else b"\x00"
                kv = {"layer.0": tuple(KVRow(bytes([ord(c)]), scales) for c in r.prompt)}
                tokens = tuple(ord(c) % 7 for c in r.prompt[: r.max_tokens])
                run.requests.append(RequestResult(i, wave, r.prompt, r.max_tokens, tokens, "length",
                                                  (("prefill", ((i, 0),)),), kv))
        return run

    def snippet(self, scenario):
        return f"their_engine.serve({scenario.requests!r}, block_size={scenario.block_size})"


def test_an_adapter_for_another_engine_is_hunted_and_shrunk(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = hunt(engine=OtherEngine(), oracles=("repeat-identical", "schedule-invariant"), max_scenarios=200,
                  budget_s=None, progress=False)
    assert report.found, report.text()
    s = report.finding.scenario
    assert s.block_size == 8 and s.repeat and len(s.requests) == 1
    assert {v.oracle for v in report.finding.violations} == {"repeat-identical"}
    assert report.finding.snippet.startswith("their_engine.serve(")
