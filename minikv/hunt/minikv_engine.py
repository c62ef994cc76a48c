"""The adapter that runs a Scenario on `minikv.LLM` and records what the oracles check.
See docs/internals.md#hunt-minikv-engine."""
from __future__ import annotations

import torch

from minikv.cache.blocks import slot_of
from minikv.config import ReproConfig
from minikv.kernels.addressing import code_byte_offsets, scale_byte_offsets
from minikv.kernels.errors import BadInputError, InvalidTypeError, InvalidValueError

from .record import KVRow, RequestResult, Run, StrayWrite
from .scenario import Scenario, torch_dtype
from .seams import record_logits
from .shadow import KernelShadow

SCALE_BYTES = 4


class MinikvEngine:
    """Runs scenarios on minikv."""

    def __init__(self, reintroduce=(), backend: str = "torch", instrument=None, engine_checks: bool = False,
                 device: str = "cpu", remember: bool = False, sanitize: bool = False):
        self.reintroduce = tuple(reintroduce)
        self.sanitize = sanitize                 # the guard-zone check alone (a reproduction's evidence)
        self.backend = backend
        self.instrument = instrument
        self.engine_checks = engine_checks
        self.device = device
        self._runs: dict | None = {} if remember else None

    def llm_kwargs(self, scenario: Scenario) -> dict:
        kw = scenario.engine_kwargs()
        kw.update(backend=self.backend, device=self.device, sanitize=self.engine_checks or self.sanitize,
                  repro=ReproConfig(check_layout=self.engine_checks), reintroduce=self.reintroduce)
        return kw

    def build(self, scenario: Scenario):
        """(the engine for `scenario`, its KernelShadow or None)."""
        import minikv
        kw = self.llm_kwargs(scenario)
        kw["dtype"] = torch_dtype(kw["dtype"])
        llm = minikv.LLM(**kw)
        if self.instrument is not None:
            self.instrument(llm)
        llm._hunt_logits = {}
        if not record_logits(llm, llm._hunt_logits):
            llm._hunt_logits = None
        # Kernels other than the references run beside them (after the instrument: a planted kernel is checked too).
        return llm, (KernelShadow(llm) if self.backend != "torch" else None)

    def snippet(self, scenario: Scenario, violations=()) -> str:
        """The scenario as a program; with a finding's `violations`, one that checks them and exits 1
        (repro.py)."""
        from .repro import TOKEN_ORACLES, snippet
        if not violations:
            return snippet(scenario, self.llm_kwargs(scenario), self.instrument)
        names = tuple(dict.fromkeys(v.oracle for v in violations))
        shown, sanitized = scenario, False
        if "writes-in-bounds" in names:
            variant = self._overrun_variant(scenario)
            if variant is not None:
                shown, sanitized = variant, True
                violations = [v for v in violations if v.oracle == "writes-in-bounds"]
        kw = self.llm_kwargs(shown)
        if sanitized:
            kw["sanitize"] = True
        direct = sanitized or any(v.oracle == "runs" or (v.oracle in TOKEN_ORACLES and v.seen_at) for v in violations)
        replay = None
        if not direct:
            instrument = ""
            if self.instrument is not None:
                instrument = f", instrument={self.instrument.__module__}.{self.instrument.__qualname__}"
            replay = (f"minikv.hunt.replay(\n    {_scenario_text(scenario)},\n    oracles={names!r}, "
                      f"reintroduce={kw['reintroduce']!r}, backend={self.backend!r}{instrument})")
        note = None
        if shown is not scenario:
            note = ("# the shrunk scenario with its pools at the smallest size its requests need"
                    + (", and the longest prompt" if shown.requests != scenario.requests else "")
                    + ": the stray writes then reach a guard zone, which the engine's sanitizer checks")
        return snippet(shown, kw, self.instrument, violations, replay_call=replay, sanitized=sanitized, note=note)

    def _overrun_variant(self, scenario: Scenario) -> Scenario | None:
        """A variant of `scenario` whose stray writes the engine's sanitizer catches (KVCacheOverrunError), or None."""
        import dataclasses

        from .scenario import blocks_for
        from .strategies import prompt_pool, token_counts
        checked = MinikvEngine(self.reintroduce, backend="torch", instrument=self.instrument, device=self.device,
                               sanitize=True)

        def smallest(s: Scenario) -> Scenario:
            sizes = [token_counts(s.model, r.prompt) for r in s.requests]
            bs = s.block_size
            cross = max(blocks_for(enc, bs) for _, enc in sizes) if any(enc for _, enc in sizes) else None
            return dataclasses.replace(s, num_blocks=max(blocks_for(dec + r.max_tokens - 1, bs)
                                                         for r, (dec, _) in zip(s.requests, sizes)),
                                       cross_pool_blocks=cross)
        longest = max(prompt_pool(scenario.model), key=lambda p: sum(token_counts(scenario.model, p)))
        one = dataclasses.replace(scenario, requests=(dataclasses.replace(scenario.requests[0], prompt=longest,
                                                                          arrival=0),))
        for candidate in (scenario, smallest(scenario), smallest(one)):
            try:
                run = checked.run(candidate)
            except Exception:  # noqa: BLE001  (a variant that cannot even be tried is no evidence)
                continue
            if run.error and run.error.startswith("KVCacheOverrunError"):
                return candidate
        return None

    # ---- one scenario -------------------------------------------------------------------------------------
    def run(self, scenario: Scenario) -> Run:
        if self._runs is not None:
            if scenario.key() not in self._runs:
                self._runs[scenario.key()] = self._run(scenario)
            return self._runs[scenario.key()]
        return self._run(scenario)

    def _run(self, scenario: Scenario) -> Run:
        run = Run(scenario)
        try:
            llm, shadow = self.build(scenario)
        except (ValueError, TypeError, BadInputError) as err:   # the engine's own input checks: outside its domain
            run.refused = _first_line(err)
            return run
        except Exception as err:  # noqa: BLE001  (an accepted configuration that cannot even start: a finding)
            run.error, run.error_at = _describe(err), "building the engine"
            return run
        run.eos_id = llm.tokenizer.eos_id
        try:
            for wave, requests in enumerate(scenario.waves()):
                if wave and scenario.sleep:
                    llm.sleep(mode=scenario.sleep)
                    llm.wake_up()
                if not self._wave(llm, wave, requests, run):
                    return run
        except Exception as err:  # noqa: BLE001  (whatever an accepted configuration raises is a finding)
            run.error, run.error_at = _describe(err), f"step {run.steps}"
        if shadow is not None:
            run.kernel_mismatches = list(shadow.mismatches)
        return run

    def _wave(self, llm, wave: int, requests, run: Run) -> bool:
        import minikv
        order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
        pending = list(order)
        ids: dict[int, int] = {}                 # engine request id -> index in the wave
        rid_of: dict[int, int] = {}              # index in the wave -> engine request id
        schedule: dict[int, list] = {i: [] for i in range(len(requests))}
        results: dict[int, RequestResult] = {}
        kv: dict[int, dict] = {}
        step = 0
        while pending or llm.has_unfinished():
            while pending and requests[pending[0]].arrival <= step:
                i = pending.pop(0)
                r = requests[i]
                try:
                    rid = llm.add_request(r.prompt, minikv.SamplingParams(temperature=0, max_tokens=r.max_tokens))
                except (ValueError, TypeError) as err:
                    run.refused = f"request {i}: {_first_line(err)}"
                    return False
                ids[rid] = i
                rid_of[i] = rid
            if not llm.has_unfinished():
                step = requests[pending[0]].arrival          # nothing runs until the next arrival
                continue
            before = llm.arena.storage.clone()
            out = llm.step()
            run.steps += 1
            run.stray_writes += self._stray(llm, out, before, run.steps - 1)
            members = tuple((ids[rid], out.num_cached_tokens.get(rid, 0)) for rid in out.request_ids)
            for rid in out.request_ids:
                schedule[ids[rid]].append((out.phase, members))
                if out.is_prefill and ids[rid] not in kv:
                    kv[ids[rid]] = self._request_kv(llm, out, rid)
            for done in out.finished:
                i = ids[done.request_id]
                r = requests[i]
                # The hunt's records name an end-of-sequence stop "eos" (vLLM's outputs say "stop", no stop_reason).
                eos = done.finish_reason == "stop" and done.outputs[0].stop_reason is None
                results[i] = RequestResult(i, wave, r.prompt, r.max_tokens, tuple(done.token_ids),
                                           "eos" if eos else done.finish_reason)
            step += 1
        for i in range(len(requests)):
            res = results[i]
            res.schedule, res.kv = tuple(schedule[i]), kv.get(i)
            rows = None if llm._hunt_logits is None else llm._hunt_logits.pop(rid_of[i], None)
            res.logits = None if rows is None else tuple(rows)
            run.requests.append(res)
        return True

    # ---- bytes ---------------------------------------------------------------------------------------------
    @staticmethod
    def _pool_kinds(llm) -> dict[str, str]:
        """Pool name -> "self" or "cross": which slot mapping names its rows (from the engine's binding table)."""
        return {b.pool: b.kind for b in llm.attention_layers.values()}

    def _stray(self, llm, out, before: torch.Tensor, step: int) -> list[StrayWrite]:
        arena = llm.arena
        changed = before != arena.storage
        if not bool(changed.any()):
            return []
        allowed = torch.zeros_like(changed)
        kinds = self._pool_kinds(llm)
        for name, start in arena.offsets.items():
            mapping = out.cross_slot_mapping if kinds.get(name) == "cross" else out.slot_mapping
            slots = [s for seq in mapping.values() for s in seq]
            if slots:
                allowed[start + _row_bytes(arena.layout(name), slots)] = True
        stray = changed & ~allowed
        found = []
        for kind, name, lo, hi in arena.byte_map():
            hits = stray[lo:hi].nonzero()
            if hits.numel():
                region = f"pool {name}" if kind == "pool" else f"guard after {name}"
                found.append(StrayWrite(step, region, int(hits[0]), int(hits.numel())))
        return found

    @staticmethod
    def _request_kv(llm, out, rid: int) -> dict[str, tuple[KVRow, ...]]:
        arena, bs = llm.arena, llm.config.cache.block_size
        storage = arena.storage
        kinds = MinikvEngine._pool_kinds(llm)
        rows = {}
        for name, start in arena.offsets.items():
            layout = arena.layout(name)
            if kinds.get(name) == "cross":
                table, n = out.cross_block_tables.get(rid), len(out.cross_slot_mapping.get(rid, ()))
            else:
                table, n = out.block_tables.get(rid), out.seq_lens.get(rid, 0)
            if not table or not n:
                continue
            slots = [slot_of(table, p, bs) for p in range(n)]
            codes = storage[start + _row_bytes(layout, slots, scales=False)].reshape(n, -1).cpu().numpy()
            scales = storage[start + _scale_bytes(layout, slots)].reshape(n, -1).cpu().numpy() \
                if layout.has_inline_scales else None
            per = [KVRow(codes[p].tobytes(), b"" if scales is None else scales[p].tobytes()) for p in range(n)]
            rows[name] = tuple(per)
        return rows


def _scale_bytes(layout, slots) -> torch.Tensor:
    """Pool byte offsets of the named slots' scales: K then V, every KV head."""
    s = torch.tensor(slots, dtype=torch.int64)
    at = torch.stack([scale_byte_offsets(layout.spec, s, kv) for kv in (0, 1)], dim=1)
    return (at[..., None] + torch.arange(SCALE_BYTES)).reshape(-1)


def _row_bytes(layout, slots, scales: bool = True) -> torch.Tensor:
    """Pool byte offsets of the named slots' rows: codes of K and V for every KV head, then their scales."""
    s = torch.tensor(slots, dtype=torch.int64)
    idx = torch.stack([code_byte_offsets(layout.spec, s, kv) for kv in (0, 1)], dim=1).reshape(-1)
    if scales and layout.has_inline_scales:
        idx = torch.cat([idx, _scale_bytes(layout, slots)])
    return idx


def _scenario_text(scenario: Scenario) -> str:
    """The scenario as a Python expression (minikv.hunt's Scenario and Request, spelled out)."""
    import dataclasses
    fields = [f"{f.name}={getattr(scenario, f.name)!r}" for f in dataclasses.fields(scenario)
              if f.name != "extra" and getattr(scenario, f.name) != f.default]
    text = ", ".join(fields).replace("Request(", "minikv.hunt.Request(")
    return f"minikv.hunt.Scenario({text})"


def _first_line(err: BaseException) -> str:
    """An error as one line. A bad option or argument is named by its standard type (ValueError, TypeError: what
    a caller catches), every other error by its own class (KVCacheOverrunError, ...)."""
    text = str(err).strip()
    name = ("ValueError" if isinstance(err, InvalidValueError) else
            "TypeError" if isinstance(err, InvalidTypeError) else type(err).__name__)
    return f"{name}: {text.splitlines()[0] if text else ''}"


def _describe(err: BaseException) -> str:
    # Type and message only: a file and line number would change the report with every unrelated edit.
    return _first_line(err)


def replay(scenario: Scenario, oracles, reintroduce=(), backend: str = "torch", instrument=None) -> int:
    """Run `scenario` through minikv's adapter and check the named oracles; print what each expected beside what
    was seen. Returns 1 when one fails, 0 when all hold (a reproduction's exit status)."""
    from . import oracles as oracle_module
    from .reference import DenseReference
    run = MinikvEngine(reintroduce, backend=backend, instrument=instrument).run(scenario)
    if run.refused:
        print(f"the engine refused the configuration: {run.refused}")
        return 2
    reference = DenseReference()
    refs = {}
    if any(oracle_module.ORACLES[n].needs_reference for n in oracles) and not run.error:
        refs = {r.prompt: reference.get(scenario.model, scenario.kv_cache_dtype, scenario.dtype, r.prompt,
                                        r.max_tokens) for r in scenario.requests}
    found = oracle_module.check(run, refs, oracles)
    for name in oracles:
        mine = [v for v in found if v.oracle == name]
        print(f"{name}: expected: {oracle_module.ORACLES[name].statement}")
        if not mine:
            print(f"{name}: seen:     it holds")
        for v in mine:
            print(f"{name}: seen:     {v.summary}" + (f" ({v.detail})" if v.detail else ""))
    return 1 if found else 0
