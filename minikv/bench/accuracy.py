"""Greedy exact-match evaluation of a shipped model through the engine, per KV cache format."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from minikv.models import tasks
from minikv.models.registry import MODEL_NAMES


@dataclass
class EvalResult:
    model: str
    kv_cache_dtype: str
    n: int
    correct: int
    seconds: float
    failures: list[tuple[str, str]]

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    def report(self) -> str:
        lines = [f"{self.model} kv_cache_dtype={self.kv_cache_dtype}: exact match {self.correct}/{self.n} "
                 f"= {100 * self.accuracy:.1f}%"]
        lines += [f"  wrong: {p!r} -> {t!r}" for p, t in self.failures[:5]]
        return "\n".join(lines)


def task_of(model, task: str | None = None) -> tasks.Task:
    """The task to evaluate `model` on: `task` if given, else a shipped model's own; a checkpoint directory (as
    `minikv train NAME` writes it, .../NAME/) takes the task of the shipped model its directory is named after."""
    if task is not None:
        return tasks.for_model(task)
    name = model if model in MODEL_NAMES else Path(model).name
    if name not in MODEL_NAMES:
        raise ValueError(f"no task for model {str(model)!r}: pass --task (task=) naming the shipped model whose "
                         f"task it was trained on ({', '.join(MODEL_NAMES)})")
    return tasks.for_model(name)


def exact_match(model: str, kv_cache_dtype: str = "auto", n: int = 200, seed: int = 0, device: str = "cpu",
                backend: str = "triton", max_num_seqs: int = 8, llm=None, task: str | None = None,
                **cache_options) -> EvalResult:
    """Run n held-out prompts of the model's task (`task_of`) greedily and count the right answers
    (`cache_options`: LLM's cache-sizing keywords, block_size, num_blocks, max_model_len, ...)."""
    import minikv
    task = task_of(model, task)
    prompts = task.prompts(n, seed=seed)
    if llm is None:
        llm = minikv.LLM(model=model, kv_cache_dtype=kv_cache_dtype, device=device, backend=backend,
                         max_num_seqs=max_num_seqs, **cache_options)
    params = [minikv.SamplingParams(temperature=0, max_tokens=task.max_tokens(p)) for p in prompts]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    failures = [(p, o.text) for p, o in zip(prompts, outs) if not task.check(p, o.text)]
    return EvalResult(str(model), kv_cache_dtype, n, n - len(failures), seconds, failures)
