"""The places the hunter reaches into an engine beyond its outputs: wrapping one of its kernel ops, and reading the
logits its sampler is given. See docs/internals.md#hunt-seams."""
from __future__ import annotations

KERNEL_OPS = ("write_kv", "decode", "context", "paged_context")


def wrap_kernel_op(llm, name: str, make) -> None:
    """Replace `llm.kernel_ops.<name>` by `make(<the current op>)`, for this engine's layers only."""
    if name not in KERNEL_OPS:
        raise ValueError(f"unknown kernel op {name!r}; the engine's kernel ops are {', '.join(KERNEL_OPS)}")
    ops = llm.kernel_ops
    # KernelOps is a frozen dataclass (nothing may rebind it by accident); this is the deliberate exception.
    object.__setattr__(ops, name, make(getattr(ops, name)))


def pool_of(llm, tensor) -> tuple[str, object] | None:
    """(arena pool name, its KVLayout) of a cache tensor a kernel was given, or None if it is not an arena pool."""
    for name in llm.arena.offsets:
        pool = llm.arena.pool(name)
        if pool.data_ptr() == tensor.data_ptr() and pool.numel() == tensor.numel():
            return name, llm.arena.layout(name)
    return None


def record_logits(llm, store: dict) -> bool:
    """Keep every logits row the engine's sampler gets, per request; False when it has no such sampler."""
    runner = getattr(llm, "runner", None)
    sample = getattr(runner, "sample", None)
    if sample is None:
        return False

    def recording(logits, seqs, *args, **kwargs):
        for row, seq in zip(logits, seqs):
            store.setdefault(seq.request_id, []).append(row.detach().float().cpu())
        return sample(logits, seqs, *args, **kwargs)
    runner.sample = recording
    return True
