"""Training and dense evaluation of the tiny models (the shipped weights are rebuilt with `train`).
See docs/internals.md#models-train."""
from __future__ import annotations

import copy
import math
import os
import platform
import random
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from minikv.kernels import formats
from minikv.kernels.quant import quantize_reference
from minikv.models import hf_checkpoint, registry, tasks
from minikv.models.dir_tokenizer import save_char_tokenizer
from minikv.models.gemma4 import Gemma4ForCausalLM
from minikv.models.t5 import T5ForConditionalGeneration

# The quantized cache formats, in the order training draws from (the shipped checkpoints were trained with it).
FAKE_QUANT_FORMATS = formats.PER_TOKEN_HEAD_KV_CACHE_DTYPES + formats.LAYER_SCALE_KV_CACHE_DTYPES
IGNORE = -100


@dataclass(frozen=True)
class Recipe:
    steps: int
    batch_size: int
    lr: float
    warmup: int
    seq_len: int = 0               # decoder-only: tokens per training sequence
    fake_quant_prob: float = 0.75  # share of steps whose K/V go through a quantized format
    small_share: float = 0.0       # tiny-gemma4: share of sequences drawn log-uniformly (small numbers)


RECIPES = {
    "tiny-gemma4": Recipe(steps=1500, batch_size=32, lr=3e-3, warmup=100, seq_len=112, small_share=0.4),
    "tiny-t5": Recipe(steps=1500, batch_size=32, lr=3e-3, warmup=100),
}


# ---- fake quantization of K/V -------------------------------------------------------------------------------

def fake_quantize(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Quantize then dequantize `x` [..., head_size] as cache format `fmt` stores it (straight-through gradient),
    with the kernels' own reference quantizer (fp8 with the per-layer scale 1.0 the engine uses)."""
    if fmt not in FAKE_QUANT_FORMATS:
        raise ValueError(f"unknown fake-quant format {fmt!r}; choose one of {', '.join(FAKE_QUANT_FORMATS)}")
    codes, scales = quantize_reference(x.detach().float(), formats.format_of(fmt, torch.float32).code)
    deq = codes.float() if scales is None else codes.float() * scales[..., None]
    return x + (deq.to(x.dtype) - x).detach()


def kv_transform_for(fmt: str | None):
    if fmt is None:
        return None
    if fmt not in FAKE_QUANT_FORMATS:
        raise ValueError(f"kv_fake_quant must be None or one of {', '.join(FAKE_QUANT_FORMATS)}, got {fmt!r}")
    return lambda t: fake_quantize(t, fmt)


# ---- training batches -----------------------------------------------------------------------------------------

def window_batch(task: tasks.WindowArithmeticTask, tokenizer, rng: random.Random, batch_size: int, seq_len: int,
                 small_share: float = 0.0):
    """Arithmetic sequences whose first term and step are uniform over the training side of the domain, so
    every window of the domain is a training prefix."""
    inputs, targets = [], []
    for _ in range(batch_size):
        first, step = task.training_start(rng, small_share)
        text = task.sequence_text(first, step, seq_len)[:seq_len]
        ids = [tokenizer.bos_id] + tokenizer.encode(text)
        target = ids[1:]
        unpredictable = len(str(first)) + 1 + len(str(first + step)) + 1    # both terms and their spaces
        target[:unpredictable] = [IGNORE] * unpredictable
        inputs.append(ids[:-1])
        targets.append(target)
    return torch.tensor(inputs), torch.tensor(targets)


def t5_batch(task: tasks.SortDistinctTask, tokenizer, rng: random.Random, batch_size: int):
    """Random strings from the training side of the split. Decoder: [BOS] + answer -> answer + [EOS]."""
    strings = []
    while len(strings) < batch_size:
        text = task.random_string(rng, rng.randint(tasks.SORT_MIN_LEN, tasks.SORT_MAX_LEN))
        if not task.is_held_out(text):
            strings.append(text)
    width = max(map(len, strings))          # answers are never longer than their prompts
    enc = torch.full((batch_size, width), tokenizer.pad_id)
    dec_in = torch.full((batch_size, width + 1), tokenizer.pad_id)
    dec_target = torch.full((batch_size, width + 1), IGNORE)
    for row, text in enumerate(strings):
        answer = tokenizer.encode(task.expected(text, len(text)))
        enc[row, : len(text)] = torch.tensor(tokenizer.encode(text))
        dec_in[row, : len(answer) + 1] = torch.tensor([tokenizer.bos_id] + answer)
        dec_target[row, : len(answer) + 1] = torch.tensor(answer + [tokenizer.eos_id])
    return enc, enc != tokenizer.pad_id, dec_in, dec_target


def _positions(ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(ids.shape[1], device=ids.device).expand_as(ids)


def init_weights(model: nn.Module) -> None:
    """transformers' initialization for the Gemma-4 and T5 models."""
    if isinstance(model, Gemma4ForCausalLM):
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
    elif isinstance(model, T5ForConditionalGeneration):     # T5PreTrainedModel._init_weights with factor 1.0
        c = model.config
        nn.init.normal_(model.shared.weight, std=1.0)
        nn.init.normal_(model.lm_head.weight, std=c.d_model ** -0.5)
        for name, module in model.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            std = {"q": (c.d_model * c.d_kv) ** -0.5, "k": c.d_model ** -0.5, "v": c.d_model ** -0.5,
                   "o": (c.num_heads * c.d_kv) ** -0.5, "wi_0": c.d_model ** -0.5, "wi_1": c.d_model ** -0.5,
                   "wi": c.d_model ** -0.5, "wo": c.d_ff ** -0.5, "relative_attention_bias": c.d_model ** -0.5}.get(leaf)
            if std is not None:
                nn.init.normal_(module.weight, std=std)


def _loss(model: nn.Module, batch, device) -> torch.Tensor:
    batch = [t.to(device) for t in batch]
    if isinstance(model, T5ForConditionalGeneration):
        enc, mask, dec_in, target = batch
        hidden = model.decode(dec_in, model.encode(enc, mask), mask)
    else:
        inputs, target = batch
        hidden = model(inputs, _positions(inputs))
    logits = model.compute_logits(hidden)
    return F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE)


def train(name: str, steps: int | None = None, seed: int = 0, out_dir: str | Path | None = None,
          progress: bool = True, device: str = "cpu", evaluate: bool = True) -> dict:
    """Train `name` from scratch and save its weights into `out_dir` (None: the package's weights folder)."""
    registry.model_config(name)                         # an unknown name: ModelLoadError listing the known ones
    if name in registry.RANDOM_WEIGHT_MODELS:
        raise ValueError(f"{name} is shipped with random weights, not trained (see minikv.models.random_weights); "
                         f"rebuild it with `python -m minikv.models.random_weights {name}`")
    recipe = RECIPES[name]
    steps = recipe.steps if steps is None else steps
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    torch.manual_seed(seed)
    rng = random.Random(f"train:{name}:{seed}")
    task, tokenizer = tasks.for_model(name), registry.get_tokenizer(name)
    model = registry.build_model(name)
    init_weights(model)
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = min(recipe.warmup, max(1, steps // 10))

    def lr_factor(step):                                # linear warmup, cosine decay to 5%
        if step < warmup:
            return (step + 1) / warmup
        progress_frac = (step - warmup) / max(1, steps - warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress_frac))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    losses: list[float] = []
    started, cpu_started, load_started = time.perf_counter(), _cpu_seconds(), os.getloadavg()
    # Passing `disable` only when asked keeps tqdm's own TQDM_DISABLE=1 switch working otherwise.
    bar = tqdm(range(steps), desc=f"train {name}", **({} if progress else {"disable": True}))
    for _ in bar:
        if isinstance(model, T5ForConditionalGeneration):
            batch = t5_batch(task, tokenizer, rng, recipe.batch_size)
        else:
            batch = window_batch(task, tokenizer, rng, recipe.batch_size, recipe.seq_len, recipe.small_share)
        fmt = rng.choice(FAKE_QUANT_FORMATS) if rng.random() < recipe.fake_quant_prob else None
        model.kv_transform = kv_transform_for(fmt)
        loss = _loss(model, batch, device)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if len(losses) % 25 == 0:
            bar.set_postfix(loss=f"{sum(losses[-25:]) / 25:.4f}")
    model.kv_transform = None
    train_seconds, train_cpu_seconds = time.perf_counter() - started, _cpu_seconds() - cpu_started

    metrics = {
        "model": name, "steps": steps, "seed": seed, "recipe": recipe.__dict__, "device": str(device),
        "train_wall_s": round(train_seconds, 1), "torch_threads": torch.get_num_threads(),
        # CPU time (user + sys) stays close to the idle-machine time of a 1-thread run; wall time grows with load
        "train_cpu_s": round(train_cpu_seconds, 1),
        "load_avg_1_5_15_start": [round(x, 2) for x in load_started],
        "load_avg_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
        "torch_version": torch.__version__, "machine": platform.processor() or platform.machine(),
        "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 5),
    }
    if evaluate:
        model.eval()
        stored = registry.build_model(name)               # evaluate what is shipped: float16-rounded weights
        stored.load_state_dict({k: v.to(registry.STORAGE_DTYPE).float() for k, v in model.state_dict().items()})
        metrics["exact_match"] = evaluation_matrix(name, stored, device=device)
    metrics["total_wall_s"] = round(time.perf_counter() - started, 1)
    save_checkpoint_dir(model, registry.checkpoint_dir(name, out_dir), metrics)
    return metrics


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def save_checkpoint_dir(model: nn.Module, path: Path, metrics: dict) -> Path:
    """config.json + model.safetensors (float16) + minikv_tokenizer.json + training.json (recipe and metrics)."""
    import json
    name = model.config.name
    hf_checkpoint.save_checkpoint(model, path, dtype=registry.STORAGE_DTYPE)
    save_char_tokenizer(registry.get_tokenizer(name), path)
    (path / "training.json").write_text(json.dumps({"training": metrics}, indent=2, sort_keys=True) + "\n")
    for written in path.iterdir():
        written.chmod(0o644)                            # save_file creates owner-only files
    return path


# ---- dense greedy decoding and evaluation --------------------------------------------------------------------

@torch.no_grad()
def generate_dense(model: nn.Module, prompts: list[str], max_new_tokens: int, batch_size: int = 64) -> list[list[int]]:
    """Greedy token ids after each prompt, without any engine. T5 outputs stop after EOS."""
    tokenizer = registry.get_tokenizer(model.config.name)
    device = next(model.parameters()).device
    if isinstance(model, T5ForConditionalGeneration):
        return _generate_t5(model, tokenizer, prompts, max_new_tokens, batch_size, device)
    out: list[list[int] | None] = [None] * len(prompts)
    by_length: dict[int, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(i)
    for indices in by_length.values():                 # equal lengths: no padding needed
        for first in range(0, len(indices), batch_size):
            chunk = indices[first: first + batch_size]
            ids = torch.tensor([[tokenizer.bos_id] + tokenizer.encode(prompts[i]) for i in chunk], device=device)
            prompt_len = ids.shape[1]
            ids = torch.cat([ids, model.greedy(ids, max_new_tokens)], dim=1)   # incremental, its DenseKVCache
            for row, i in enumerate(chunk):
                out[i] = ids[row, prompt_len:].tolist()
    return out


def _generate_t5(model, tokenizer, prompts, max_new_tokens, batch_size, device):
    out = []
    for first in range(0, len(prompts), batch_size):
        chunk = prompts[first: first + batch_size]
        width = max(map(len, chunk))
        enc = torch.full((len(chunk), width), tokenizer.pad_id, device=device)
        for row, text in enumerate(chunk):
            enc[row, : len(text)] = torch.tensor(tokenizer.encode(text), device=device)
        mask = enc != tokenizer.pad_id
        encoder_out = model.encode(enc, mask)
        ids = torch.full((len(chunk), 1), tokenizer.bos_id, device=device)
        for _ in range(max_new_tokens):
            hidden = model.decode(ids, encoder_out, mask)
            ids = torch.cat([ids, model.compute_logits(hidden[:, -1]).argmax(-1)[:, None]], dim=1)
            if bool((ids == tokenizer.eos_id).any(dim=1).all()):
                break
        for row in ids[:, 1:].tolist():
            out.append(row[: row.index(tokenizer.eos_id) + 1] if tokenizer.eos_id in row else row)
    return out


def expected_ids(name: str, prompt: str) -> list[int]:
    """The token ids greedy decoding must produce for `prompt` with the task's default max_tokens."""
    task, tokenizer = tasks.for_model(name), registry.get_tokenizer(name)
    if isinstance(task, tasks.SortDistinctTask):
        return tokenizer.encode(task.expected(prompt, len(prompt))) + [tokenizer.eos_id]
    return tokenizer.encode(task.expected(prompt, task.default_max_tokens))


def evaluate_dense(name: str, n: int = 200, kv_fake_quant: str | None = None, dtype: torch.dtype | None = None,
                   *, model: nn.Module | None = None, seed: int = 0, device: str = "cpu") -> dict:
    """Greedy exact-match rate on `n` held-out prompts, in dense mode."""
    transform = kv_transform_for(kv_fake_quant)
    if model is None:
        model = registry.load_model(name, device=device, dtype=dtype)
    elif dtype is not None:
        model = copy.deepcopy(model).to(dtype)
    task, tokenizer = tasks.for_model(name), registry.get_tokenizer(name)
    prompts = task.prompts(n, seed=seed)
    previous, model.kv_transform = model.kv_transform, transform
    try:
        got = generate_dense(model.eval(), prompts, task.default_max_tokens)
    finally:
        model.kv_transform = previous
    failures = []
    for prompt, ids in zip(prompts, got):
        want = expected_ids(name, prompt)
        if ids != want:
            failures.append((prompt, tokenizer.decode(want), tokenizer.decode(ids)))
    correct = n - len(failures)
    return {"exact_match": correct / n if n else 1.0, "correct": correct, "n": n, "failures": failures}


def evaluation_matrix(name: str, model: nn.Module, n: int = 200, device: str = "cpu") -> dict:
    """Exact match in float32 and the inference dtypes (CPU and CUDA), without and with each fake-quantized format."""
    results = {}
    dtypes = [torch.float32]
    for where in ("cpu", "cuda"):
        if registry.default_dtype(name, where) not in dtypes:
            dtypes.append(registry.default_dtype(name, where))
    for dtype in dtypes:
        copy = registry.build_model(name).to(device)
        copy.load_state_dict(model.state_dict())
        copy = copy.to(dtype)
        for fmt in (None,) + FAKE_QUANT_FORMATS:
            key = f"{str(dtype).removeprefix('torch.')}/{fmt or 'none'}"
            results[key] = evaluate_dense(name, n, fmt, model=copy, device=device)["exact_match"]
    return results
