"""`python -m minikv.bench engine`: end-to-end generation speed through the engine.
See docs/internals.md#bench-engine."""
from __future__ import annotations

import cProfile
import csv
import io
import pstats
import statistics
import sys
import tempfile
import time

from minikv.bench.timing import NOISY, REMEASURES
from minikv.kernels.formats import KV_CACHE_DTYPES

# The per-token-head formats with their scales grouped per block half (kv_scale_placement="block"), as format names
BLOCK_PLACED = ("fp8_per_token_head/block", "int8_per_token_head/block")
ONE_BYTE = ("fp8", "int8_per_token_head", "fp8_per_token_head", *BLOCK_PLACED)


def cache_args(name: str) -> dict:
    """minikv.LLM's cache arguments for a bench format name: a kv_cache_dtype, "/block" for the block placement."""
    kv_cache_dtype, _, placement = name.partition("/")
    return {"kv_cache_dtype": kv_cache_dtype, "kv_scale_placement": placement or "row"}


def measure(backend: str, device: str, kv_cache_dtype: str, prompts: int, max_tokens: int, max_num_seqs: int,
            model: str = "tiny-gemma4"):
    import minikv
    from minikv.bench.accuracy import task_of
    task = task_of(model)
    ps = task.prompts(prompts, seed=0)
    llm = minikv.LLM(model=model, kv_cache_dtype=kv_cache_dtype, device=device, backend=backend,
                     max_num_seqs=max_num_seqs)
    start, cpu_start = time.perf_counter(), time.process_time()
    outs = llm.generate(ps, minikv.SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = sum(len(o.token_ids) for o in outs)
    right = sum(task.check(p, o.text) for p, o in zip(ps, outs))
    return seconds, cpu_seconds, tokens, right


def e2b_like_checkpoint(path, device: str = "cuda", **overrides) -> None:
    """A random minikv Gemma-4 checkpoint at gemma-4-E2B's layer dimensions (or `overrides` of them), written to
    `path` in bfloat16: the weights of minikv.bench.sdpa_step.e2b_like_model (seed 0)."""
    from minikv.bench.sdpa_step import e2b_like_model
    from minikv.models.dir_tokenizer import save_char_tokenizer
    from minikv.models.hf_checkpoint import save_checkpoint
    from minikv.models.tokenizer import CharTokenizer
    save_checkpoint(e2b_like_model(device, **overrides), path)
    save_char_tokenizer(CharTokenizer(), path)


def _replay_ms(llm, batch: int, reps: int = 20) -> float | None:
    """Milliseconds of one replay of the engine's captured decode graph for `batch` sequences (None: none)."""
    import torch
    graphs = llm.runner.graphs
    captured = graphs.captured.get(batch) if graphs is not None else None
    if captured is None:
        return None
    captured.graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        captured.graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


PREFILL_TOKENS_PER_STEP = 16384     # the engine's max_num_batched_tokens in the GPU runs


def decode_step_bytes(llm, batch: int, context: int) -> int:
    """The bytes one decode step of `batch` sequences at `context` tokens must read: every weight it multiplies (a
    LM head tied to the embedding whole), the rows it gathers from each embedding table, and the K/V each
    attention layer attends over (its window's tokens on a sliding layer) in its cache's format."""
    import torch
    model, bindings = llm.runner.model, llm.runner.bindings.values()
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    gathered = {id(t) for t in tables}
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in gathered)
    rows = sum(batch * t.shape[1] * t.element_size() for t in tables)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    tied = head.numel() * head.element_size() if head is not None and id(head) in gathered else 0
    kv = sum(b.layout.bytes_per_token() * min(context, getattr(b.impl, "sliding_window", 0) or context)
             for b in bindings if b.kind == "self")
    return weights + rows + tied + batch * kv


def copy_bandwidth() -> float:
    """The device-to-device copy's GB/s (bytes read and written), measured now (minikv.bench.timing.ceilings)."""
    from minikv.bench.timing import ceilings
    return ceilings(gib=2.0)["copy_GBps"]


def step_figures(full_steps: list[float]) -> dict:
    """The per-step columns of a row from the seconds of its full decode steps, in order: step_ms (the median) and
    the spread (timing.Timing's min_ms, max_ms, noisy; no re-measuring here) leave out the first step, the first
    launch of a graph captured the step before (a launch that, in CUDA, also uploads the graph; about 1 ms slower on
    an H100), and the last, which frees every block of the batch: work done once per graph and per request, which
    the mean in decode_ms_per_step still carries. steps_ms keeps every step."""
    steady = full_steps[1:-1] if len(full_steps) > 3 else full_steps
    return dict(step_ms=1e3 * statistics.median(steady), min_ms=1e3 * min(steady), max_ms=1e3 * max(steady),
                noisy=max(steady) > (1 + NOISY) * min(steady), steps_ms=" ".join(f"{1e3 * t:.2f}" for t in full_steps))


def gpu_decode_speed(path, kv_cache_dtype: str, batch: int, context: int, new_tokens: int,
                     enforce_eager: bool | None = None, profile=None, copy_GBps: float | None = None) -> dict:
    """Decode tokens/s of the engine on the checkpoint at `path`: `batch` prompts of `context` tokens. With
    `copy_GBps` (the measured copy bandwidth), the step's physical bound too: decode_step_bytes / copy_GBps."""
    import random

    import torch

    import minikv
    llm = minikv.LLM(model=str(path), **cache_args(kv_cache_dtype), device="cuda", dtype=torch.bfloat16,
                     max_num_seqs=batch, sanitize=False,                   # no canary check per step
                     max_num_batched_tokens=max(PREFILL_TOKENS_PER_STEP, context + new_tokens + 16),   # >= one prompt
                     enforce_eager=enforce_eager)
    rng = random.Random(0)
    prompts = ["".join(rng.choice("0123456789 ") for _ in range(context)) for _ in range(batch)]
    params = minikv.SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    # Compile first, at the prefill steps' own composition (as many prompts as one step's token budget holds):
    # Triton specializes kernels on some integer arguments, so a warm-up with fewer prompts leaves compiles in
    # the measured prefill (seen on the H200: 9-26k tokens/s in the first run at a context, 53-70k after).
    per_step = max(1, min(batch, PREFILL_TOKENS_PER_STEP // max(context, 1)))
    llm.generate(prompts[:per_step], minikv.SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    for p in prompts:
        llm.add_request(p, params)
    decode_seconds, decode_tokens, prefill_seconds, prefill_tokens, modes = 0.0, 0, 0.0, 0, set()
    full_steps = []                     # seconds of each steady step that decoded the whole batch
    while llm.has_unfinished():
        start = time.perf_counter()
        if profile is not None and decode_tokens:           # steady decode steps only
            profile.enable()
        out = llm.step()
        if profile is not None:
            profile.disable()
        took = time.perf_counter() - start            # the sampled ids are on the host: the step is done
        if out.phase == "decode":
            if out.trace.cuda_graph == "captured":     # this step also recorded the graph: not a steady step
                continue
            modes.add(out.trace.cuda_graph)
            decode_seconds += took
            decode_tokens += len(out.sampled)
            if len(out.sampled) == batch:
                full_steps.append(took)
        else:
            prefill_seconds += took
            prefill_tokens += sum(out.seq_lens[r] - out.num_cached_tokens[r] for r in out.request_ids)
    steps = max(1, decode_tokens // batch)
    row = {"format": kv_cache_dtype, "batch": batch, "context": context, "new_tokens": new_tokens,
           "mode": "/".join(sorted(modes)), "decode_tokens_per_s": decode_tokens / decode_seconds,
           "decode_ms_per_step": 1e3 * decode_seconds / steps, "prefill_s": prefill_seconds,
           "prefill_tokens_per_s": prefill_tokens / max(prefill_seconds, 1e-9)}
    if full_steps:
        row.update(step_figures(full_steps))
    replay = _replay_ms(llm, batch)
    if replay is not None:
        row["graph_replay_ms"] = replay
        row["graph_replay_tokens_per_s"] = 1e3 * batch / replay
    if copy_GBps:
        row["bound_bytes"] = decode_step_bytes(llm, batch, context)
        row["bound_ms"] = row["bound_bytes"] / copy_GBps / 1e6
        row["copy_GBps"] = copy_GBps
    del llm
    torch.cuda.empty_cache()
    return row


def sdpa_row(batch: int, context: int) -> dict:
    """The E2B-like model's decode step with torch SDPA over a contiguous bf16 cache, captured in a CUDA graph
    (minikv.bench.sdpa_step), as a row: mode "sdpa-graph" ("sdpa-eager" if it could not be captured)."""
    from minikv.bench.sdpa_step import step_ms
    ms, how = step_ms(batch, context)
    return {"format": "auto", "batch": batch, "context": context, "mode": "sdpa-graph" if how == "cuda graph"
            else "sdpa-eager", "decode_tokens_per_s": 1e3 * batch / ms, "decode_ms_per_step": ms, "timing": how}


def _log_row(log, r) -> None:
    if r["mode"].startswith("sdpa"):
        log(f"  {'SDPA step, contiguous bf16':26s} B={r['batch']:<3d} ctx={r['context']:<5d} {r['mode']:10s} "
            f"{r['decode_tokens_per_s']:8.0f} decode tokens/s ({r['decode_ms_per_step']:6.2f} ms per step) "
            f"({r['run_s']:.0f} s)")
        return
    replay = (f"; graph replay alone {r['graph_replay_ms']:6.2f} ms" if "graph_replay_ms" in r else "")
    bound = ""
    if "bound_ms" in r:
        at = f", replay at {100 * r['bound_ms'] / r['graph_replay_ms']:.0f}% of it" if "graph_replay_ms" in r else ""
        bound = f"; bound {r['bound_ms']:5.2f} ms{at}"
    steps = (f"; steps {r['min_ms']:.2f}-{r['max_ms']:.2f} ms, median {r['step_ms']:.2f}{' noisy' if r['noisy'] else ''}"
             if "min_ms" in r else "")
    log(f"  {r['format']:26s} B={r['batch']:<3d} ctx={r['context']:<5d} {r['mode']:10s} "
        f"{r['decode_tokens_per_s']:8.0f} decode tokens/s ({r['decode_ms_per_step']:6.2f} ms per step{replay}{bound}"
        f"{steps}); prefill {r['prefill_tokens_per_s']:8.0f} tokens/s ({r['run_s']:.0f} s)")


CONTEXTS = (512, 2048, 8192)
EAGER_FORMATS = ("auto", "int8_per_token_head")


# The 1-byte formats' decode tokens/s over bf16's, by context: a longer context reads more of the cache
ONE_BYTE_GOALS = {8192: 1.25, 32768: 1.4}
CAPACITY_GIB = 16           # the KV budget of the capacity runs
CAPACITY_CONTEXT = 8192


def kv_bytes_per_sequence(kv_cache_dtype: str, context: int, block_size: int = 16) -> int:
    """KV bytes one sequence of `context` tokens holds in the bench's model (minikv.bench.sdpa_step's config): every
    layer that owns a cache, its tokens rounded up to whole blocks, in `kv_cache_dtype` (a bench format name)."""
    import torch

    from minikv.bench.sdpa_step import e2b_like_config
    from minikv.cache.layout import KVLayout
    from minikv.models.gemma4 import Gemma4Config
    config = Gemma4Config.from_hf_dict(e2b_like_config())
    tokens = -(-context // block_size) * block_size
    cache = cache_args(kv_cache_dtype)
    return sum(tokens * KVLayout(cache["kv_cache_dtype"], torch.bfloat16, config.layer_kv_heads[i],
                                 config.layer_head_dims[i], block_size, cache["kv_scale_placement"]).bytes_per_token()
               for i in range(config.num_hidden_layers) if config.kv_sources[i] == i)


def capacity_batch(kv_cache_dtype: str, context: int = CAPACITY_CONTEXT, budget_gib: float = CAPACITY_GIB,
                   new_tokens: int = 16) -> int:
    """The most sequences of `context` prompt tokens (and `new_tokens` more) whose KV fits `budget_gib`."""
    return int(budget_gib * 2**30 // kv_bytes_per_sequence(kv_cache_dtype, context + new_tokens))


def plan(kv_cache_dtypes=KV_CACHE_DTYPES, batch: int = 64, context: int = 2048, contexts=CONTEXTS,
         eager_formats=EAGER_FORMATS, context_formats=None, extras: bool = True) -> list[tuple[str, int, int, str]]:
    """The runs of `gpu_rows`, in order: (format, batch, context, how), how "graph", "eager" or "sdpa"."""
    def at(ctx, formats):
        runs = [(f, batch, ctx, "graph") for f in formats]
        return runs + ([(f, batch, ctx, "eager") for f in eager_formats] + [("auto", batch, ctx, "sdpa")]
                       if extras else [])
    runs = at(context, kv_cache_dtypes)
    if extras:
        runs += [("auto", 1, context, how) for how in ("graph", "eager", "sdpa")]
    for ctx in sorted(set(contexts) - {context}, reverse=True):
        runs += at(ctx, kv_cache_dtypes if context_formats is None else context_formats)
    return runs


def least_spread(run, profile, log) -> dict:
    """`run(profile)`'s row; while its steady steps spread more than NOISY, up to REMEASURES more runs (no profile),
    keeping the row of the least spread, with `remeasured` saying how many were taken; logged if it stays noisy."""
    row = run(profile)
    attempts = 0
    while row.get("noisy") and attempts < REMEASURES:
        attempts += 1
        again = run(None)
        if again["max_ms"] / again["min_ms"] < row["max_ms"] / row["min_ms"]:
            row = again
    row["remeasured"] = attempts
    if row.get("noisy"):
        log(f"  {row['format']} B={row['batch']} ctx={row['context']}: its steady steps still spread "
            f"{row['max_ms'] / row['min_ms'] - 1:.0%} after {attempts} more runs")
    return row


def gpu_rows(kv_cache_dtypes=KV_CACHE_DTYPES, batch: int = 64, context: int = 2048, new_tokens: int = 16,
             log=print, contexts=CONTEXTS, eager_formats=EAGER_FORMATS, context_formats=None, csv_path=None,
             extras: bool = True, profile: bool = False, capacity: bool | str = False) -> list[dict]:
    """Decode speed per format on a fresh E2B-like checkpoint, one dict per (format, batch, context, mode);
    capacity="only": the capacity runs alone."""
    import torch
    runs = [] if capacity == "only" else plan(kv_cache_dtypes, batch, context, contexts, eager_formats,
                                              context_formats, extras)
    if capacity:        # per format, the most sequences whose KV fits CAPACITY_GIB at CAPACITY_CONTEXT
        runs += [(f, capacity_batch(f, new_tokens=new_tokens), CAPACITY_CONTEXT, "capacity") for f in kv_cache_dtypes]
    longest = max([context, *contexts] + ([CAPACITY_CONTEXT] if capacity else []))
    what = (f"the capacity runs only, prompts of {CAPACITY_CONTEXT} tokens" if capacity == "only" else
            f"batch {batch}, prompts of {context} tokens (and "
            f"{', '.join(str(c) for c in sorted(set(contexts) - {context})) or 'no other'})")
    log(f"gemma-4-E2B-like model (random weights, bf16), {what}, {new_tokens} new tokens, {len(runs)} runs, "
        f"{torch.cuda.get_device_name()}")
    rows, begin = [], time.perf_counter()
    copy_GBps = copy_bandwidth()
    log(f"measured device-to-device copy: {copy_GBps:.0f} GB/s (the physical bound of a step: the bytes it must "
        f"read / this)")
    with tempfile.TemporaryDirectory() as path:
        e2b_like_checkpoint(path, max_position_embeddings=max(4096, longest + new_tokens + 16))
        for i, (fmt, b, ctx, how) in enumerate(runs):
            start = time.perf_counter()
            prof = cProfile.Profile() if profile and i == 0 else None
            if how == "sdpa":
                try:
                    r = sdpa_row(b, ctx)
                except Exception as e:   # noqa: BLE001 - a reference row: the engine's runs go on without it
                    log(f"  SDPA step, batch {b}, context {ctx}: failed ({type(e).__name__}: {e})")
                    torch.cuda.empty_cache()
                    continue
            else:
                r = least_spread(lambda profile: gpu_decode_speed(
                    path, fmt, b, ctx, new_tokens, enforce_eager=True if how == "eager" else None, profile=profile,
                    copy_GBps=copy_GBps), prof, log)
                if how == "capacity":
                    r.update(mode="capacity", kv_budget_gib=CAPACITY_GIB)
            r["run_s"] = time.perf_counter() - start
            if prof is not None:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
                log(f"host profile of {fmt}'s steady decode steps (cProfile, by own time):\n{text.getvalue()}")
            rows.append(r)
            _log_row(log, r)
            if csv_path:                      # after every run: a time limit keeps what finished
                write_csv(rows, csv_path)
    log(f"{len(rows)} runs in {time.perf_counter() - begin:.0f} s")
    for r in rows:
        base = next((x for x in rows if x["format"] == "auto" and (x["batch"], x["context"], x["mode"])
                     == (r["batch"], r["context"], r["mode"])), None)
        if base and not r["mode"].startswith("sdpa"):
            r["x_auto"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
    return rows


def reports(rows: list[dict]) -> list[tuple[str, float]]:
    """(what, ratio) reported beside the targets, with no target of their own: per SDPA graph step, its time per
    output token over the engine's (bf16, graphs) at the same batch and context."""
    out = []
    for s in (r for r in rows if r["mode"] == "sdpa-graph"):
        e = next((r for r in rows if (r["format"], r["mode"], int(r["batch"]), int(r["context"])) ==
                  ("auto", "replayed", int(s["batch"]), int(s["context"]))), None)
        if e:
            replay = f"; its graph replay alone {e['graph_replay_ms']:.2f} ms" if e.get("graph_replay_ms") else ""
            what = (f"time per output token, SDPA graph step ({s['decode_ms_per_step']:.2f} ms) / engine "
                    f"({e['decode_ms_per_step']:.2f} ms{replay}), bf16, batch {int(s['batch'])}, context "
                    f"{int(s['context'])}")
            out.append((what, s["decode_ms_per_step"] / e["decode_ms_per_step"]))
    return out


def per_step_ms(row: dict) -> float:
    """A row's per-step milliseconds: its median full step, or (rows written before that column) its mean."""
    return float(row.get("step_ms") or row["decode_ms_per_step"])


def step_kind(row: dict) -> str:
    return "median step" if row.get("step_ms") else "mean step"


def targets(rows: list[dict]) -> list[tuple[str, float, float]]:
    """(what, measured ratio, target) for the end-to-end targets, each ratio within the one run `rows`."""
    out = []

    def find(fmt, batch, context, mode):
        return next((r for r in rows if (r["format"], int(r["batch"]), int(r["context"]), r["mode"])
                     == (fmt, batch, context, mode)), None)
    main = [r for r in rows if int(r["batch"]) > 1 and r["mode"] == "replayed"]
    if main:
        batch, context = int(main[0]["batch"]), int(main[0]["context"])
        for r in (x for x in main if x.get("graph_replay_ms") not in (None, "")):
            out.append((f"engine decode {step_kind(r)} vs its own graph replay, {r['format']}, batch {batch}, context "
                        f"{int(r['context'])}", float(r["graph_replay_ms"]) / per_step_ms(r), 0.9))
        for r in (x for x in main if x["format"] == "auto"):
            sdpa = find("auto", batch, int(r["context"]), "sdpa-graph")
            if sdpa:
                out.append((f"engine decode {step_kind(r)} vs the SDPA graph step, bf16, batch {batch}, context "
                            f"{int(r['context'])}", float(sdpa["decode_ms_per_step"]) / per_step_ms(r),
                            1.0))
        for r in (x for x in main if int(x["context"]) == context and x.get("bound_ms") not in (None, "")
                  and x.get("graph_replay_ms") not in (None, "")):
            out.append((f"graph replay vs the physical bound (bytes read / copy bandwidth), {r['format']}, batch "
                        f"{batch}, context {context}", float(r["bound_ms"]) / float(r["graph_replay_ms"]), 0.5))
        for ctx in sorted(c for c in {int(x["context"]) for x in main} if c in ONE_BYTE_GOALS):
            bf16 = find("auto", batch, ctx, "replayed")
            for fmt in ONE_BYTE:
                r = find(fmt, batch, ctx, "replayed")
                if r and bf16:
                    name, _, placement = fmt.partition("/")
                    out.append((f"{name} vs bf16 engine decode tokens/s, batch {batch}, context {ctx} "
                                f"({placement or 'default'} placement)",
                                float(r["decode_tokens_per_s"]) / float(bf16["decode_tokens_per_s"]),
                                ONE_BYTE_GOALS[ctx]))
        eager = find("auto", batch, context, "eager")
        graph = find("auto", batch, context, "replayed")
        if eager and graph:
            out.append((f"bf16 engine decode, CUDA graphs vs eager, batch {batch}, context {context}",
                        float(graph["decode_tokens_per_s"]) / float(eager["decode_tokens_per_s"]), 1.0))
        for r in rows:
            # 5x the 16-23k tokens/s measured before this target was set (64 prompts x 2,048 tokens, H200): only
            # at that prompt length (a longer prompt's attention grows with its square)
            if int(r["batch"]) > 1 and r["mode"] == "replayed" and int(r["context"]) == context == 2048:
                out.append((f"prefill tokens/s, {r['format']}, vs 5 x 23,000",
                            float(r["prefill_tokens_per_s"]) / 115000, 1.0))
    return out


def write_csv(rows: list[dict], path) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def format_targets(rows: list[dict]) -> list[str]:
    from minikv.bench.timing import format_ratio
    from minikv.bench.transformers_peer import peer_targets
    return [f"{'met   ' if v >= g else 'MISSED'} {format_ratio(v):>7s} (target {g:.2f}x)  {w}"
            for w, v, g in targets(rows) + peer_targets(rows)]


def summary(rows: list[dict]) -> list[str]:
    """The lines printed after the runs: batch 1's time per output token per mode, the reports, the targets."""
    from minikv.bench.timing import format_ratio
    lines = []
    b1 = {r["mode"]: r for r in rows if int(r["batch"]) == 1}
    if b1:
        lines.append("batch 1, bf16: time per output token " + ", ".join(
            f"{m} {r['decode_ms_per_step']:.2f} ms" for m, r in sorted(b1.items())))
    cap = [r for r in rows if r["mode"] == "capacity"]
    base = next((r for r in cap if r["format"] == "auto"), None)
    if cap:
        lines.append(f"\ncapacity: the most sequences whose KV fits {CAPACITY_GIB} GiB at context {CAPACITY_CONTEXT}, "
                     "and decode tokens/s at that batch:")
        lines += [f"  {r['format']:22s} batch {int(r['batch']):4d}  {float(r['decode_tokens_per_s']):8.0f} tokens/s"
                  + (f"  ({float(r['decode_tokens_per_s']) / float(base['decode_tokens_per_s']):.2f}x bf16's)"
                     if base else "") for r in cap]
    if reports(rows):
        lines.append("\nreported beside the targets (ratios within this run, no target):")
        lines += [f"report {format_ratio(value):>7s}  {what}" for what, value in reports(rows)]
    return lines + ["\ntargets (ratios within this run):"] + format_targets(rows)


def contexts_of(args) -> list[int]:
    """The contexts measured: --contexts, or with the older --long-context N, --context and N (0: --context alone);
    --context is measured in every case."""
    if args.long_context is not None:
        return [args.context] + ([args.long_context] if args.long_context else [])
    return sorted({args.context, *args.contexts})


def gpu_args(argv=()):
    """The GPU bench's arguments from a list of command-line words (`minikv.bench attention --engine-args`)."""
    return parser().parse_args(["--device", "cuda", *argv])


def measured_rows(args, log) -> list[dict]:
    """Every row the GPU bench's `args` ask for: the engine's runs, then the transformers peer's if asked."""
    if args.peer_only and not args.peer:
        raise SystemExit("minikv bench engine: --peer-only needs --peer transformers")
    rows = [] if args.peer_only else gpu_rows(
        args.kv_cache_dtypes, args.batch, args.context, args.new_tokens, log=log, contexts=contexts_of(args),
        eager_formats=args.eager_formats, context_formats=args.context_formats, csv_path=args.csv,
        extras=not args.no_extras, profile=args.profile, capacity="only" if args.capacity_only else args.capacity)
    if args.peer == "transformers":
        from minikv.bench import transformers_peer
        log(f"\npeer: transformers on one gemma-4-E2B text model (random weights, bf16) that it builds and saves; "
            f"{args.batch} prompts of {args.context} random token ids, {args.new_tokens} new tokens")
        with tempfile.TemporaryDirectory() as path:
            transformers_peer.build_checkpoint(path)
            rows += transformers_peer.peer_rows(path, args.batch, args.context, args.new_tokens, log=log)
    return rows


def gpu_main(args) -> int:
    log = lambda line: print(line, flush=True)  # noqa: E731
    rows = measured_rows(args, log)
    for line in summary(rows):
        log(line)
    if args.csv:
        write_csv(rows, args.csv)
        print(f"wrote {args.csv}")
    return 0


def parser():
    from minikv.engine.arguments import UsageParser, model_arg, positive_int
    from minikv.config import BACKENDS
    from minikv.config import KV_CACHE_DTYPES as FORMATS
    p = UsageParser(prog="minikv bench engine", description=__doc__)
    model_arg(p)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-cache-dtype", default="int8_per_token_head", choices=FORMATS, help="CPU: the cache format")
    p.add_argument("--prompts", type=positive_int, default=48, help="CPU: prompts")
    p.add_argument("--max-tokens", type=positive_int, default=12, help="CPU: new tokens per prompt")
    p.add_argument("--max-num-seqs", type=positive_int, default=8, help="CPU: batch")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS, help="CPU: backends")
    p.add_argument("--kv-cache-dtypes", nargs="+", default=list(KV_CACHE_DTYPES), choices=FORMATS + BLOCK_PLACED,
                   help="GPU: the cache formats (\"/block\": kv_scale_placement=\"block\")")
    p.add_argument("--batch", type=positive_int, default=64, help="GPU: sequences decoded together")
    p.add_argument("--context", type=positive_int, default=2048,
                   help="GPU: prompt tokens per sequence of the main runs (the targets, batch 1)")
    p.add_argument("--new-tokens", type=positive_int, default=16, help="GPU: tokens generated per sequence")
    p.add_argument("--contexts", type=positive_int, nargs="+", default=list(CONTEXTS),
                   help="GPU: every context measured (--context is added)")
    p.add_argument("--context-formats", "--long-formats", nargs="+", default=None, choices=FORMATS + BLOCK_PLACED,
                   help="GPU: the formats measured with graphs at the contexts other than --context (default: "
                        "every one of --kv-cache-dtypes)")
    p.add_argument("--eager-formats", nargs="+", default=list(EAGER_FORMATS), choices=FORMATS + BLOCK_PLACED,
                   help="GPU: the formats also measured eagerly (enforce_eager=True) at every context")
    p.add_argument("--long-context", type=int, default=None,
                   help="GPU, older form: --contexts CONTEXT N (0: --context alone)")
    p.add_argument("--no-extras", action="store_true", help="GPU: no eager, batch-1 and SDPA-step runs")
    p.add_argument("--profile", action="store_true", help="GPU: cProfile the first format's decode steps")
    p.add_argument("--capacity", action="store_true",
                   help=f"GPU: also each format at the most sequences whose KV fits {CAPACITY_GIB} GiB at context "
                        f"{CAPACITY_CONTEXT}")
    p.add_argument("--capacity-only", action="store_true", help="GPU: only the --capacity runs")
    p.add_argument("--peer", choices=("transformers",), default=None,
                   help="GPU: also transformers' prefill and generate beside minikv's on one E2B-sized checkpoint "
                        "(minikv.bench.transformers_peer; needs transformers)")
    p.add_argument("--peer-only", action="store_true", help="GPU: only the peer's rows (with --peer)")
    p.add_argument("--csv", default=None, help="GPU: write the rows here")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.device.startswith("cuda"):
        return gpu_main(args)
    print(f"{args.model}, {args.prompts} prompts x {args.max_tokens} new tokens, max_num_seqs={args.max_num_seqs}, "
          f"kv_cache_dtype={args.kv_cache_dtype}, device={args.device}")
    results = {}
    for backend in args.backends:
        seconds, cpu_seconds, tokens, right = measure(backend, args.device, args.kv_cache_dtype, args.prompts,
                                                      args.max_tokens, args.max_num_seqs, args.model)
        results[backend] = seconds
        cpu = f" ({cpu_seconds:.1f} s CPU)" if args.device == "cpu" else ""
        print(f"  {backend:7s} {seconds:7.1f} s{cpu}  {tokens / seconds:8.1f} tokens/s  ({right}/{args.prompts} right)")
    if "triton" in results and "torch" in results:
        print(f"  triton / torch time ratio: {results['triton'] / results['torch']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
