"""minikv: a small, readable paged and quantized KV-cache inference engine with Triton kernels.

    import minikv
    llm = minikv.LLM(model="tiny-gemma4", kv_cache_dtype="int8_per_token_head", max_num_seqs=4)
    outs = llm.generate(["3 7 11 15"], minikv.SamplingParams(temperature=0, max_tokens=12))
    outs[0].outputs[0].text
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "LLM": ("minikv.engine.llm", "LLM"),
    "ReproConfig": ("minikv.config", "ReproConfig"),
    "SamplingParams": ("minikv.engine.sampling_params", "SamplingParams"),
    "RequestOutput": ("minikv.engine.outputs", "RequestOutput"),
    "CompletionOutput": ("minikv.engine.outputs", "CompletionOutput"),
    "Logprob": ("minikv.engine.outputs", "Logprob"),
    "KVCacheOverrunError": ("minikv.cache.arena", "KVCacheOverrunError"),
    "KVLayoutMismatchError": ("minikv.cache.layout", "KVLayoutMismatchError"),
    "KVLayout": ("minikv.cache.layout", "KVLayout"),
    "KVArena": ("minikv.cache.arena", "KVArena"),
    "MinikvError": ("minikv.kernels.errors", "MinikvError"),
    "MaxModelLenError": ("minikv.engine.memory", "MaxModelLenError"),
    "EngineFaultError": ("minikv.engine.errors", "EngineFaultError"),
    "ConcurrentUseError": ("minikv.engine.errors", "ConcurrentUseError"),
    "EngineNeedsResetError": ("minikv.engine.errors", "EngineNeedsResetError"),
}
# Modules importable as `minikv.NAME` (`minikv.tasks.for_model(...)`, `from minikv import bugs`) and where they live.
_MODULES = {
    "tasks": "minikv.models.tasks",
    "bugs": "minikv.defects.registry",
    "exercises": "minikv.viz.exercises",
    **{name: f"minikv.{name}" for name in ("viz", "kernels", "cache", "engine", "models", "attention")},
}


def __getattr__(name):
    # Lazy, so that `import minikv` stays cheap and importing minikv.kernels decides the Triton mode first.
    import importlib
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'minikv' has no attribute {name!r}")


__all__ = ["LLM", "ReproConfig", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob",
           "KVCacheOverrunError", "KVLayoutMismatchError", "KVLayout", "KVArena", "MaxModelLenError", "tasks", "bugs",
           "viz"]
