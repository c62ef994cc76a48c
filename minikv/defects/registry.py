"""The historical defects minikv reproduces, and the per-engine switch that brings each one back.
See docs/internals.md#defects-registry."""
from __future__ import annotations

from dataclasses import dataclass

from minikv.defects import provenance
from minikv.kernels.errors import InvalidTypeError, InvalidValueError


@dataclass(frozen=True)
class Defect:
    name: str
    summary: str
    upstream_engine: str
    upstream_reference: str
    code_site: str


DEFECTS: dict[str, Defect] = {d.name: d for d in (
    Defect(
        name="scale-wipe",
        summary="KV-sharing layers' lazy scale-view setup fills the shared cache's inline scales with 1.0 in the "
                "middle of the first real batch, wiping the per-token scales the target layer just wrote.",
        upstream_engine="vLLM (Triton attention backend, int8/fp8 per-token-head KV cache, Gemma-4 KV sharing)",
        upstream_reference=provenance.reference("scale-wipe"),
        code_site="minikv/attention/impl.py: AttentionImpl._scale_views_historical / _scale_views_once_per_storage",
    ),
    Defect(
        name="cross-stride",
        summary="The cross-attention layer builds its backend without the quantization config, so it addresses "
                "the 1-byte fp8 cross pool with a 16-bit element size: every block lands at twice its offset.",
        upstream_engine="TensorRT-LLM (PyTorch backend, encoder-decoder cross attention, fp8 KV cache)",
        upstream_reference=provenance.reference("cross-stride") + " (first of its two fixes)",
        code_site="minikv/attention/cross.py: CrossAttentionModule.__init__ (eager order) / "
                  "CrossAttentionModule.create_weights (deferred order)",
    ),
    Defect(
        name="cross-fp8-context-read",
        summary="The fused context-attention path for cross attention reads K/V back from the fp8 cross cache but "
                "is told the cache's data type only when paged context FMHA is on, so it decodes fp8 bytes as 16-bit.",
        upstream_engine="TensorRT-LLM (PyTorch backend, fused context FMHA for cross attention)",
        upstream_reference=provenance.reference("cross-fp8-context-read") + " (second fix: fall back to the "
                           "unfused context path for quantized cross attention unless paged context FMHA is on)",
        code_site="minikv/attention/cross.py: CrossAttentionImpl._context_read_layout",
    ),
)}


def validate(names) -> frozenset[str]:
    """Check a `reintroduce=` argument (a list or tuple of defect names); return it as a frozenset."""
    if isinstance(names, str):
        raise InvalidTypeError(f"reintroduce takes a tuple of defect names, e.g. ({names!r},), not a string")
    if not isinstance(names, (list, tuple, set, frozenset)):
        raise InvalidTypeError(f"reintroduce must be a tuple or list of defect names ({', '.join(DEFECTS)}); "
                               f"got {type(names).__name__} {names!r}; () reintroduces nothing")
    for name in names:
        if not isinstance(name, str):
            raise InvalidTypeError(f"reintroduce holds defect names (str), got {type(name).__name__} {name!r}")
    names = frozenset(names)
    unknown = sorted(names - DEFECTS.keys())
    if unknown:
        raise InvalidValueError(f"unknown defect(s) {unknown}; known: {', '.join(DEFECTS)}")
    return names


def table() -> str:
    """A plain-text table of the registry, for the CLI and notebooks."""
    lines = []
    for d in DEFECTS.values():
        lines += [f"{d.name}", f"  {d.summary}", f"  upstream: {d.upstream_engine}",
                  f"  reference: {d.upstream_reference}", f"  code site: {d.code_site}"]
    return "\n".join(lines)
