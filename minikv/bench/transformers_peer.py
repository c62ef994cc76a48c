"""`minikv bench engine --device cuda --peer transformers`: minikv beside transformers on one checkpoint.
See docs/internals.md#bench-transformers-peer."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

# gemma-4-E2B's text model (its config.json), random weights: what the peer rows run on
E2B = dict(vocab_size=262_144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
           num_key_value_heads=1, head_dim=256, global_head_dim=512, layer_types=["sliding_attention"] * 4
           + ["full_attention"], sliding_window=512, num_kv_shared_layers=20, hidden_size_per_layer_input=256,
           vocab_size_per_layer_input=262_144, use_double_wide_mlp=True, final_logit_softcapping=30.0)
REPEATS = 3
PREFILL_STEP_TOKENS = 16384      # minikv's max_num_batched_tokens here (the faster of 16k and 64k on an H100)


def import_transformers():
    try:
        import transformers
    except ImportError as err:
        raise SystemExit("--peer transformers needs transformers: pip install transformers==5.24.0") from err
    return transformers


def build_checkpoint(path, device: str = "cuda", **dims) -> None:
    """transformers builds and saves the model (bf16, seed 0); minikv's character tokenizer goes beside it (the
    runs pass token ids, so no tokenizer's vocabulary matters)."""
    from minikv.models.dir_tokenizer import save_char_tokenizer
    from minikv.models.tokenizer import CharTokenizer
    transformers = import_transformers()
    dims = {**E2B, **dims}
    layers = dims["num_hidden_layers"]
    dims["layer_types"] = (dims["layer_types"] * layers)[:layers]
    config = transformers.Gemma4TextConfig(**dims, max_position_embeddings=131_072, pad_token_id=0, eos_token_id=1,
                                           bos_token_id=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Gemma4ForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(path, max_shard_size="4GB")
    save_char_tokenizer(CharTokenizer(), path)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _median_s(fn, device: str) -> float:
    fn()                                                      # warm-up: compiles, allocator
    times = []
    for _ in range(REPEATS):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def transformers_row(path, ids: torch.Tensor, new_tokens: int, device: str = "cuda", compiled: bool = False,
                     prefill_s: float | None = None) -> tuple[dict, torch.Tensor]:
    """(row, generated ids). Prefill: one forward with logits_to_keep=1 (what its generate runs for the prompt;
    `prefill_s` reuses a measured one). Decode: its generate (greedy) less that prefill, per step: with its dynamic
    cache, eager; or (`compiled`) with its static cache, whose decoding forward generate compiles with
    torch.compile (on a CPU too, where generate would not)."""
    transformers = import_transformers()
    model = transformers.Gemma4ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device).eval()
    ids = ids.to(device)
    extra = {}
    if compiled:
        compile_config = transformers.CompileConfig()
        compile_config._compile_all_devices = True        # generate compiles on CUDA only unless told
        extra = dict(cache_implementation="static", compile_config=compile_config)
    last = {}

    def generate():
        last["ids"] = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                     pad_token_id=0, **extra)
    if prefill_s is None:
        prefill_s = _median_s(lambda: model(ids, logits_to_keep=1), device)
    whole = _median_s(generate, device)
    step = max(whole - prefill_s, 1e-9) / max(new_tokens - 1, 1)
    del model
    _free(device)
    how = ", static cache, compiled" if compiled else ""
    return _row(f"transformers {transformers.__version__}{how}", ids, prefill_s, step), last["ids"].cpu()


def minikv_row(path, ids: torch.Tensor, new_tokens: int, fast_prefill: bool, device: str = "cuda") -> dict:
    """The same prompts through LLM.step (CUDA graphs on CUDA), each step's time given to its phase: prefill is the
    prefill steps' time, decode the decode steps' time per step. One pass gives both (the difference of two
    generate calls, as the transformers row takes it, came out negative once: decode is 1% of a pass here)."""
    import minikv
    batch, context = ids.shape
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    llm = minikv.LLM(model=str(path), dtype=dtype, device=device, max_num_seqs=batch, sanitize=False,
                     max_num_batched_tokens=max(PREFILL_STEP_TOKENS, context), max_model_len=context + new_tokens + 16,
                     kv_sharing_fast_prefill=fast_prefill, backend="triton" if device.startswith("cuda") else "torch")
    params = minikv.SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)

    def one_pass() -> tuple[float, float]:
        for row in ids.tolist():
            llm.add_request({"prompt_token_ids": row}, params)
        spent, steps = {"prefill": 0.0, "decode": 0.0}, {"prefill": 0, "decode": 0}
        _sync(device)
        while llm.has_unfinished():
            start = time.perf_counter()
            phase = llm.step().phase            # a step returns once its tokens are on the host
            spent[phase] += time.perf_counter() - start
            steps[phase] += 1
        return spent["prefill"], spent["decode"] / max(steps["decode"], 1)
    one_pass()                                  # warm-up: compiles kernels, captures the decode graph
    passes = [one_pass() for _ in range(REPEATS)]
    del llm
    _free(device)
    return _row(f"minikv, kv_sharing_fast_prefill={fast_prefill}", ids, statistics.median(p for p, _ in passes),
                statistics.median(s for _, s in passes))


def _row(engine: str, ids: torch.Tensor, prefill_s: float, step_s: float) -> dict:
    batch, context = ids.shape
    return {"format": "auto", "batch": batch, "context": context, "mode": "peer", "engine": engine,
            "prefill_s": prefill_s, "prefill_tokens_per_s": batch * context / prefill_s,
            "decode_ms_per_step": 1e3 * step_s, "decode_tokens_per_s": batch / step_s}


def _free(device: str) -> None:
    import gc
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def peer_rows(path, batch: int, context: int, new_tokens: int, device: str = "cuda", log=print,
              compiled: bool | None = None) -> list[dict]:
    """transformers' rows (eager; and, by default on CUDA, static cache compiled), then minikv's without and with
    kv_sharing_fast_prefill, on `batch` prompts of `context` random token ids (seed 0) of the checkpoint at `path`.
    A compiled row that fails is logged and left out; one whose tokens differ from the eager row's says so."""
    vocab = json.loads((Path(path) / "config.json").read_text())["vocab_size"]
    ids = torch.randint(3, vocab, (batch, context), generator=torch.Generator().manual_seed(0))
    eager, eager_ids = transformers_row(path, ids, new_tokens, device)
    rows = [eager]
    if device.startswith("cuda") if compiled is None else compiled:
        try:
            row, row_ids = transformers_row(path, ids, new_tokens, device, compiled=True,
                                            prefill_s=eager["prefill_s"])
            rows.append(row | {"same_tokens_as_eager": bool(torch.equal(row_ids, eager_ids))})
        except Exception as err:  # noqa: BLE001 - "where that works": any failure of theirs is reported, not fatal
            log(f"  transformers, static cache, compiled: failed ({type(err).__name__}: {str(err)[:200]})")
            _free(device)
    rows += [minikv_row(path, ids, new_tokens, fast, device) for fast in (False, True)]
    for r in rows:
        same = {True: "; tokens as eager", False: "; tokens differ from eager"}.get(r.get("same_tokens_as_eager"), "")
        log(f"  {r['engine']:56s} B={batch:<3d} ctx={context:<5d} prefill {r['prefill_tokens_per_s']:9.0f} tokens/s "
            f"({r['prefill_s']:.3f} s); decode {r['decode_ms_per_step']:6.2f} ms per step{same}")
    return rows


def peer_targets(rows: list[dict]) -> list[tuple[str, float, float]]:
    """minikv's prefill against transformers' (its eager row: the compiled one reuses that prefill) and its decode
    step against each of transformers' rows, within one run."""
    theirs = [r for r in rows if r.get("engine", "").startswith("transformers")]
    if not theirs:
        return []
    out = []
    for r in (x for x in rows if x.get("engine", "").startswith("minikv")):
        out.append((f"prefill tokens/s vs transformers' (same checkpoint and prompts), {r['engine']}",
                    r["prefill_tokens_per_s"] / theirs[0]["prefill_tokens_per_s"], 1.0))
        for t in theirs:
            how = "static cache, compiled" if "compiled" in t["engine"] else "eager"
            out.append((f"decode step vs transformers' generate ({how}), {r['engine']}",
                        t["decode_ms_per_step"] / r["decode_ms_per_step"], 1.0))
    return out
