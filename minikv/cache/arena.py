"""KVArena: one byte allocation per device holding every KV pool, separated by guard zones (the sanitizer).
See docs/internals.md#cache-arena."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minikv.kernels.errors import CheckFailedError

from .layout import KVLayout

CANARY = bytes([0xA5, 0x5A, 0xC3, 0x3C])
ALIGN = 256


class KVCacheOverrunError(CheckFailedError, RuntimeError):
    """A guard zone of the KV arena was written: some kernel addressed bytes outside its pool."""

    def __init__(self, pool: str, guard_start: int, guard_end: int, first_offset: int, bytes_damaged: int,
                 step_output=None):
        self.pool, self.guard_start, self.guard_end = pool, guard_start, guard_end
        self.first_offset, self.bytes_damaged = first_offset, bytes_damaged
        # The engine's failed step as far as it got (a minikv.engine.step.StepOutput), when an LLM raised it.
        self.step_output = step_output
        super().__init__(f"KV cache overrun past pool {pool!r}: guard zone bytes [{guard_start}, {guard_end}) of the "
                         f"arena were written; first corrupted byte at arena offset {first_offset} ({bytes_damaged} "
                         f"bytes damaged)")

    def at_step(self, step_output) -> KVCacheOverrunError:
        """The same overrun, raised again by the engine with the step it failed in."""
        return KVCacheOverrunError(self.pool, self.guard_start, self.guard_end, self.first_offset,
                                   self.bytes_damaged, step_output=step_output)


@dataclass(frozen=True)
class PoolSpec:
    name: str
    layout: KVLayout
    num_blocks: int

    @property
    def nbytes(self) -> int:
        return self.layout.pool_bytes(self.num_blocks)


def _round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def _checked_specs(specs: list[PoolSpec], guard_bytes: int) -> dict[str, PoolSpec]:
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names must be unique: {names}")
    if guard_bytes < ALIGN or guard_bytes % ALIGN:
        raise ValueError(f"guard_bytes must be a positive multiple of {ALIGN}")
    return {s.name: s for s in specs}


class KVArena:
    """One uint8 tensor holding named pools with canary-filled guard zones between them."""

    def __init__(self, specs: list[PoolSpec], device: torch.device | str = "cpu", guard_bytes: int = 4096,
                 reach_elem_bytes: int | None = None):
        self.specs = _checked_specs(specs, guard_bytes)
        self.device = torch.device(device)
        self.guards = [("<arena start>", 0, guard_bytes)]   # (name of the pool before it, start, end)
        self.offsets: dict[str, int] = {}
        cursor = guard_bytes
        for s in specs:
            self.offsets[s.name] = cursor
            start = cursor + s.nbytes          # the guard begins at the pool's last byte + 1
            cursor = _round_up(start + guard_bytes)
            self.guards.append((s.name, start, cursor))
        # The tail guard must hold the farthest byte any pool can be addressed at with the widest element.
        tail_end = cursor
        for s in specs:
            widest = max(reach_elem_bytes or s.layout.elem_bytes, s.layout.elem_bytes)
            reach = self.offsets[s.name] + s.nbytes * widest // s.layout.elem_bytes
            tail_end = max(tail_end, _round_up(reach))
        name, start, _ = self.guards[-1]
        self.guards[-1] = (name, start, tail_end)
        self.nbytes = tail_end

        self.storage = torch.zeros(self.nbytes, dtype=torch.uint8, device=self.device)
        self._canary = torch.tensor(list(CANARY), dtype=torch.uint8, device=self.device)
        for _, start, end in self.guards:
            self.storage[start:end].copy_(self._expected(start, end))
        self._pools = {s.name: self.storage[self.offsets[s.name]: self.offsets[s.name] + s.nbytes]
                       .view(s.num_blocks, s.layout.block_bytes) for s in specs}

    def _expected(self, start: int, end: int) -> torch.Tensor:
        # The pattern is anchored at arena offset 0, so a guard may start at any byte.
        first = start - start % len(CANARY)
        reps = self._canary.repeat((end - first + len(CANARY) - 1) // len(CANARY))
        return reps[start - first: end - first]

    def pool(self, name: str) -> torch.Tensor:
        """The pool's bytes, a [num_blocks, block_bytes] uint8 view of the arena (the same object every call)."""
        return self._pools[name]

    def layout(self, name: str) -> KVLayout:
        return self.specs[name].layout

    def bind(self, name: str, backend_layout: KVLayout, check: bool = True) -> torch.Tensor:
        """Hand a pool to a backend; with `check`, its layout must equal the one the pool was allocated with."""
        if check:
            self.specs[name].layout.check_compatible(backend_layout, where=f"pool {name!r}")
        return self._pools[name]

    def damaged_guards(self) -> list[tuple[str, int, int, int, int]]:
        """[(pool before the guard, guard start, guard end, first damaged offset, bytes damaged)]."""
        found = []
        for name, start, end in self.guards:
            region = self.storage[start:end]
            expect = self._expected(start, end)
            bad = (region != expect).nonzero()
            if bad.numel():
                found.append((name, start, end, start + int(bad[0]), int(bad.numel())))
        return found

    def check(self) -> None:
        """Raise KVCacheOverrunError if any guard zone's canary was overwritten."""
        damaged = self.damaged_guards()
        if damaged:
            raise KVCacheOverrunError(*damaged[0])

    def byte_map(self) -> list[tuple[str, str, int, int]]:
        """[(kind, name, start, end)] for every region, in address order: for pictures of the arena."""
        regions = [("guard", g[0], g[1], g[2]) for g in self.guards]
        regions += [("pool", n, o, o + self.specs[n].nbytes) for n, o in self.offsets.items()]
        return sorted(regions, key=lambda r: r[2])

    def free(self) -> None:
        """Drop the allocation (sleep); the arena is unusable afterwards."""
        self._pools.clear()
        self.storage = None


class SeparateKVArena(KVArena):
    """Every pool in an allocation of its own, as TensorRT-LLM's pool manager allocates them."""

    def __init__(self, specs: list[PoolSpec], device: torch.device | str = "cpu", guard_bytes: int = 4096,
                 reach_elem_bytes: int | None = None, guarded: bool | None = None):
        self.specs = _checked_specs(specs, guard_bytes)
        self.device = torch.device(device)
        self.guarded = self.device.type == "cpu" if guarded is None else bool(guarded)
        self._canary = torch.tensor(list(CANARY), dtype=torch.uint8, device=self.device)
        self.storage = None                            # no single allocation: see `storages`
        self.storages: dict[str, torch.Tensor] = {}    # pool name -> its allocation (pool bytes, then its guard)
        self.guards = []                               # (pool, start, end) inside that pool's own allocation
        self.offsets = {s.name: 0 for s in specs}      # each pool starts its own allocation
        for s in specs:
            tail = 0
            if self.guarded:
                widest = max(reach_elem_bytes or s.layout.elem_bytes, s.layout.elem_bytes)
                tail = _round_up(s.nbytes * widest // s.layout.elem_bytes - s.nbytes + guard_bytes)
            storage = torch.zeros(s.nbytes + tail, dtype=torch.uint8, device=self.device)
            if tail:
                storage[s.nbytes:].copy_(self._expected(s.nbytes, s.nbytes + tail))
                self.guards.append((s.name, s.nbytes, s.nbytes + tail))
            self.storages[s.name] = storage
        self.nbytes = sum(t.numel() for t in self.storages.values())
        self._pools = {s.name: self.storages[s.name][: s.nbytes].view(s.num_blocks, s.layout.block_bytes)
                       for s in specs}

    def damaged_guards(self) -> list[tuple[str, int, int, int, int]]:
        """[(pool, guard start, guard end, first damaged offset, bytes damaged)]."""
        found = []
        for name, start, end in self.guards:
            bad = (self.storages[name][start:end] != self._expected(start, end)).nonzero()
            if bad.numel():
                found.append((name, start, end, start + int(bad[0]), int(bad.numel())))
        return found

    def byte_map(self) -> list[tuple[str, str, int, int]]:
        """[(kind, name, start, end)] per pool and its guard, each in its own allocation's offsets."""
        regions = []
        for name, spec in self.specs.items():
            regions.append(("pool", name, 0, spec.nbytes))
            regions += [("guard", g[0], g[1], g[2]) for g in self.guards if g[0] == name]
        return regions

    def free(self) -> None:
        self._pools.clear()
        self.storages.clear()
