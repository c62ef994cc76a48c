"""Defect B1's runs: the same requests on cross pools of several sizes, buggy and fixed, sanitizer on and off.
See docs/internals.md#repro-cross-stride-run."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

MODEL = "tiny-t5"
FACTORS = (0.75, 1.0, 1.5, 1.99, 2.0, 3.0)
VERSIONS = ("historical", "fallback", "taught-fused")
RESULTS_COMMAND = "minikv repro cross-stride --results results/cross_stride.json"
NOTEBOOK = "notebooks/04_cross_attention_stride_doubling.ipynb"     # prints every quantity's display


def model_dtype(device="cpu") -> torch.dtype:
    """The 16-bit dtype tiny-t5 runs in here: float16 on CPU (the Triton interpreter has no bfloat16), bfloat16 on
    CUDA. tiny-t5's own default on CPU is float32, which would hide B2 (float32 always takes the unfused path)."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float16


def engine(kv_cache_dtype: str = "fp8", device="cpu", backend="triton", model: str = MODEL, **kwargs):
    """A tiny-t5 (or `model`) engine in the 16-bit model dtype; kwargs go to `minikv.LLM` (and may override
    `dtype`)."""
    import minikv
    kwargs.setdefault("dtype", model_dtype(device))
    return minikv.LLM(model=model, kv_cache_dtype=kv_cache_dtype, device=device, backend=backend, **kwargs)


def task_of(model: str = MODEL):
    """tiny-t5's task, or for a T5 checkpoint directory the task `minikv.tasks.for_checkpoint` fits to its
    tokenizer."""
    import minikv
    from minikv.models import registry
    if registry.is_checkpoint_model(model):
        return minikv.tasks.for_model(model)
    return minikv.tasks.for_checkpoint(registry.get_tokenizer(model), model=str(model), encoder_decoder=True)


def make_prompts(n: int = 6, seed: int = 0, model: str = MODEL) -> list[str]:
    return task_of(model).prompts(n, seed=seed)


def generate_tokens(llm, prompts):
    import minikv
    task = task_of(llm.model_name)
    params = [minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p)) for p in prompts]
    return [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def reference_tokens(prompts, device="cpu", backend="triton", model: str = MODEL) -> list[list[int]]:
    return generate_tokens(engine("auto", device, backend, model, max_num_seqs=len(prompts)), prompts)


AUTO_REFERENCE = "the auto-cache run"
SPLIT_REFERENCE = ("buggy runs: the buggy engine on a pool of 3x the blocks needed, where nothing overruns; fixed "
                   "runs: the fixed fp8 engine on an automatically sized pool (an fp8 cache itself changes this "
                   "model's tokens, so no run equals the auto-cache run)")


def references(prompts, need: int, device="cpu", backend="triton", model: str = MODEL) -> tuple[list, list, str]:
    """(token ids a buggy B1 run is compared with, those a fixed run is compared with, what they are)."""
    import minikv
    auto = reference_tokens(prompts, device, backend, model)
    fp8 = generate_tokens(engine("fp8", device, backend, model, max_num_seqs=len(prompts)), prompts)
    if fp8 == auto:
        return auto, auto, AUTO_REFERENCE
    ample = engine("fp8", device, backend, model, max_num_seqs=len(prompts), cross_pool_blocks=3 * need,
                   repro=minikv.ReproConfig(check_layout=False), reintroduce=("cross-stride",))
    return generate_tokens(ample, prompts), fp8, SPLIT_REFERENCE


@dataclass
class PoolRun:
    factor: float
    blocks: int
    buggy: bool
    sanitize: bool
    outcome: str          # "correct" | "overrun caught" | "wrong tokens" | "correct, guard hit"
    detail: str = ""
    wrong: list[int] = field(default_factory=list)     # requests whose token ids differ from the auto-cache run


def run_pool(prompts, reference, factor: float, need: int, buggy: bool, sanitize: bool, device="cpu",
             backend="triton", model: str = MODEL, kv_arena: str = "one") -> PoolRun:
    import minikv
    blocks = max(1, math.floor(factor * need))
    llm = engine("fp8", device, backend, model, max_num_seqs=len(prompts), cross_pool_blocks=blocks,
                 sanitize=sanitize, reintroduce=("cross-stride",) if buggy else (),
                 repro=minikv.ReproConfig(check_layout=False, kv_arena=kv_arena))
    try:
        tokens = generate_tokens(llm, prompts)
    except minikv.KVCacheOverrunError as err:
        return PoolRun(factor, blocks, buggy, sanitize, "overrun caught", f"pool {err.pool!r}")
    damage = llm.arena.damaged_guards()
    where = f"guard bytes written after {', '.join(d[0] for d in damage)}" if damage else ""
    if tokens == reference:
        # With the sanitizer off an overrun that stays inside a guard zone harms nothing, but it still happened.
        return PoolRun(factor, blocks, buggy, sanitize, "correct, guard hit" if damage else "correct", where)
    wrong = [i for i, (t, r) in enumerate(zip(tokens, reference)) if t != r]
    return PoolRun(factor, blocks, buggy, sanitize, "wrong tokens", f"{len(wrong)}/{len(prompts)} requests; {where}",
                   wrong)


def identical_requests(prompt: str, device="cpu", backend="torch",
                       model: str = MODEL) -> list[tuple[int, float, list[int]]]:
    """Three copies of one request, buggy, sanitizer off, on cross pools from 1x to 2x the blocks they need:
    [(blocks, factor, indices of the copies whose token ids differ from the reference run)] (`references`)."""
    import minikv
    prompts = [prompt] * 3
    need = engine("fp8", device, backend, model).cross_blocks_needed(prompts)
    reference = references(prompts, need, device, backend, model)[0]
    rows = []
    for blocks in range(need, 2 * need + 1):
        llm = engine("fp8", device, backend, model, max_num_seqs=3, cross_pool_blocks=blocks, sanitize=False,
                     repro=minikv.ReproConfig(check_layout=False), reintroduce=("cross-stride",))
        tokens = generate_tokens(llm, prompts)
        rows.append((blocks, blocks / need, [i for i, (t, r) in enumerate(zip(tokens, reference)) if t != r]))
    return rows


def bind_time_check(device="cpu", model: str = MODEL) -> str:
    """With the layout contract on, the buggy cross backend must fail when it is bound to its pool."""
    import minikv
    try:
        engine("fp8", device, model=model, reintroduce=("cross-stride",))
    except minikv.KVLayoutMismatchError as err:
        return str(err)
    return ""
