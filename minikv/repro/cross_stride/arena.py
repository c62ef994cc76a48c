"""Where B1's doubled stride lands in the arena: how far past its pool each cross layer's last block ends
(`overrun_facts`), the bytes either side of a pool boundary (`byte_arrangement`), and the same runs in one
arena and in an allocation per pool (`arena_runs`). See docs/internals.md#repro-cross-stride-arena."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .run import MODEL, PoolRun, engine, run_pool, task_of


@dataclass
class Overrun:
    """Where one cross layer's highest block in use ends with the historical stride, in one buggy arena."""
    pool: str
    bytes_past_end: int      # 0 when the block ends inside the pool
    lands_in: str            # the region holding the block's last byte: the pool itself, "guard after X", or a pool


def overrun_facts(factor: float, need: int, device="cpu", model: str = MODEL) -> list[Overrun]:
    """For a cross pool of floor(factor * need) blocks: per cross layer, how far past its pool the historical
    layout puts the end of block need - 1 (the highest block the requests hold), and what lies there."""
    import minikv
    llm = engine("fp8", device, "torch", model, cross_pool_blocks=max(1, math.floor(factor * need)),
                 reintroduce=("cross-stride",), repro=minikv.ReproConfig(check_layout=False))
    arena = llm.arena
    facts = []
    for a in [a for a in llm.attention_layers.values() if a.kind == "cross"]:
        name = a.pool
        start = arena.offsets[name]
        end = start + a.impl.layout.row_offset(need, 0, 0, 0)          # the historical (16-bit) block stride
        pool_end = start + arena.pool(name).numel()
        region = next(r for r in arena.byte_map() if r[2] <= end - 1 < r[3])
        lands = region[1] if region[0] == "pool" else f"guard after {region[1]}"
        facts.append(Overrun(name, max(0, end - pool_end), lands))
    return facts


def byte_arrangement(prompts, reference, factor: float, need: int, device="cpu", backend="torch",
                     model: str = MODEL) -> dict:
    """One `stride_byte_map` panel of a buggy engine with a cross pool of `factor` times the need."""
    import minikv
    blocks = max(1, math.floor(factor * need))
    llm = engine("fp8", device, backend, model, max_num_seqs=len(prompts), cross_pool_blocks=blocks, sanitize=False,
                 repro=minikv.ReproConfig(check_layout=False), reintroduce=("cross-stride",))
    task = task_of(model)
    ids = [llm.add_request(p, minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p))) for p in prompts]
    cross_tables, self_tables, done = {}, {}, {}
    while llm.has_unfinished():
        out = llm.step()
        for rid in out.request_ids:
            self_tables[rid] = list(out.block_tables[rid])
            if out.is_prefill:
                cross_tables[rid] = list(out.cross_block_tables[rid])
        done.update({r.request_id: r.token_ids for r in out.finished})
    arena = llm.arena
    doubled = {}
    for a in [a for a in llm.attention_layers.values() if a.kind == "cross"]:
        name = a.pool
        start, addressed = arena.offsets[name], a.impl.layout
        doubled[name] = [(start + addressed.row_offset(b, 0, 0, 0), start + addressed.row_offset(b + 1, 0, 0, 0), r)
                         for r, rid in enumerate(ids) for b in cross_tables[rid]]
    self_blocks = []
    for name in [a.pool for a in llm.attention_layers.values() if a.kind == "self" and a.kv_sharing_target is None]:
        start, layout = arena.offsets[name], arena.layout(name)
        self_blocks += [(start + layout.row_offset(b, 0, 0, 0), start + layout.row_offset(b + 1, 0, 0, 0), r)
                        for r, rid in enumerate(ids) for b in self_tables[rid]]
    wrong = [i for i, rid in enumerate(ids) if done[rid] != reference[i]]
    return {"title": f"{factor:g}x: {blocks} blocks per cross pool ({need} needed)", "regions": arena.byte_map(),
            "doubled": doubled, "self_blocks": self_blocks, "wrong": wrong,
            "cross_tables": [cross_tables[rid] for rid in ids]}


def fp8_row_read(llm, pool: str, slot: int = 0, head: int = 0, kv: int = 0):
    """One row of an FP8 pool, and what the historical 16-bit context read makes of it."""
    from minikv.attention.cross import sixteen_bit_read_of
    from minikv.kernels.addressing import row_byte_offsets
    layout = llm.arena.layout(pool)
    if layout.kv_cache_dtype != "fp8":
        raise ValueError(f"pool {pool!r} holds {layout.kv_cache_dtype}, not fp8: build the engine with "
                         "kv_cache_dtype='fp8'")
    flat = llm.arena.pool(pool).view(-1)
    start = layout.row_offset(slot // layout.block_size, kv, slot % layout.block_size, head)
    fp8_values = flat[start:start + layout.head_size].clone().view(torch.float8_e4m3fn).float()
    read = sixteen_bit_read_of(layout)
    read_start = int(row_byte_offsets(read, torch.tensor([slot]), kv)[0, head])
    raw = flat[read_start:read_start + 2 * layout.head_size].clone()
    return raw, fp8_values, raw.view(layout.model_dtype).float()


ARENAS = {"one": "every pool in one allocation (minikv's KVArena)",
          "per-pool": "an allocation per pool (SeparateKVArena; TensorRT-LLM's pool manager)"}


def arena_runs(prompts, reference, need: int, factor: float = 1.5, device="cpu", backend="torch",
               model: str = MODEL) -> list[tuple[str, PoolRun]]:
    """The historical stride on a pool of `factor` x the blocks needed, in each arena shape, sanitizer on and
    off: [(arena, run)]."""
    return [(arena, run_pool(prompts, reference, factor, need, True, sanitize, device, backend, model,
                             kv_arena=arena)) for arena in ARENAS for sanitize in (True, False)]


def arena_rows(runs: list[tuple[str, PoolRun]], n: int) -> list[list]:
    return [[arena, "on" if r.sanitize else "off", r.blocks,
             r.outcome + (f" ({wrong_of(r.wrong, n)})" if r.outcome == "wrong tokens" else "")] for arena, r in runs]


ARENA_COLUMNS = ["arena", "sanitizer", "cross pool blocks", "historical stride"]


def wrong_of(wrong: list[int], n: int) -> str:
    return f"{len(wrong)} of {n}"


def format_arena_runs(runs: list[tuple[str, PoolRun]], n: int) -> str:
    table = [ARENA_COLUMNS] + arena_rows(runs, n)
    widths = [max(len(str(r[i])) for r in table) for i in range(len(ARENA_COLUMNS))]
    lines = ["  ".join(f"{c!s:{w}}" for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def check_arena_runs(runs: list[tuple[str, PoolRun]]) -> list[str]:
    """One arena: caught with the sanitizer on, wrong tokens without it; per pool (CPU, guarded): caught, and
    harmless without the sanitizer (the overrun stays in the pool's own guard)."""
    problems = []
    for arena, r in runs:
        want = "overrun caught" if r.sanitize else ("wrong tokens" if arena == "one" else "correct, guard hit")
        if r.outcome != want:
            problems.append(f"{arena} arena, sanitizer {'on' if r.sanitize else 'off'}: {r.outcome}, expected {want}")
    return problems
