"""The backend hunt's scenario families: what each varies, what it needs of a backend, and how hypothesis draws it.

A family runs only where the backend's `Features` have what it needs; otherwise the report says it was skipped and
why (the backend's own note). Every draw shrinks toward the plainest case: one request whose tokens exactly fill
one block, in order, at the front of its pool, float32 where the backend computes in it.
"""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from minikv.attention.protocol import Features

from .kernel_case import KernelCase


@dataclass(frozen=True)
class Family:
    name: str
    statement: str


FAMILIES = {f.name: f for f in (
    Family("block-tables", "permuted block tables, spare blocks, a pool inside a larger allocation, 1-4 requests"),
    Family("gqa", "1-4 KV heads, 1-8 query heads per KV head; decode, paged and workspace context"),
    Family("head-sizes", "head sizes from 64 to 512"),
    Family("block-sizes", "every block size the backend takes"),
    Family("sliding-window", "sliding windows from 1 token to 3 blocks, decode and causal context"),
    Family("kv-sharing", "one layer writes a pool, 2-3 layers read it with their own queries and windows"),
    Family("cross-pools", "encoder-decoder cross attention: non-causal context and decode over an encoder's pool"),
    Family("fp8-scales", "1-byte formats with their scales: fp8 per-layer k_scale/v_scale, per-token-head scales in "
                         "both placements, large and small magnitudes"),
)}


def _note(features: Features, key: str, default: str) -> str:
    return features.notes.get(key, default)


def skip_reason(name: str, features: Features) -> str | None:
    """Why family `name` cannot run on a backend with `features` (None: it runs)."""
    if name == "sliding-window" and not features.sliding_window:
        return _note(features, "sliding_window", "the backend has no sliding window")
    if name == "cross-pools" and not features.non_causal:
        return _note(features, "non_causal", "the backend has no non-causal (cross) attention")
    if name == "fp8-scales" and not [f for f in features.formats if f != "auto"]:
        return _note(features, "formats", "the backend reads no 1-byte format")
    if name == "head-sizes" and not [h for h in features.head_sizes if 64 <= h <= 512]:
        return _note(features, "head_sizes", "the backend takes no head size from 64 to 512")
    return None


def coverage_note(name: str, features: Features) -> str:
    """What part of family `name` the backend leaves out (empty when none)."""
    if name == "head-sizes":
        missing = [h for h in (64, 128, 256, 512) if h not in features.head_sizes]
        if missing:
            return f"not {', '.join(map(str, missing))}: " + _note(features, "head_sizes", "not supported")
    if name == "fp8-scales":
        missing = [f for f in ("fp8", "int8_per_token_head", "fp8_per_token_head") if f not in features.formats]
        if missing:
            return f"not {', '.join(missing)}: " + _note(features, "formats", "not supported")
    return ""


def _pick(preferred, available):
    return preferred if preferred in available else available[0]


@st.composite
def _lengths(draw, block_size: int, most: int = 3, max_blocks: int = 3):
    """1-`most` requests' KV lengths: whole blocks less a tail (shrinks to one exactly full block)."""
    n = draw(st.integers(1, most))
    return tuple(draw(st.integers(1, max_blocks)) * block_size - draw(st.integers(0, block_size - 1))
                 for _ in range(n))


@st.composite
def cases(draw, name: str, features: Features):
    """A KernelCase of family `name` for a backend with `features`."""
    dtype = draw(st.sampled_from(features.dtypes))
    head = _pick(64, features.head_sizes)
    block = _pick(16, features.block_sizes)
    kw = {"family": name, "dtype": dtype, "head_size": head, "block_size": block,
          "seed": draw(st.integers(0, 2 ** 16))}
    step = st.sampled_from(("decode", "context"))
    if name == "block-tables":
        kw.update(step=draw(step), shuffle=draw(st.integers(0, 999)), spare_blocks=draw(st.integers(0, 6)),
                  pool_offset=draw(st.integers(0, 3)), seq_lens=draw(_lengths(block, most=4)))
    elif name == "gqa":
        kw.update(step=draw(st.sampled_from(("decode", "context", "workspace"))),
                  num_kv_heads=draw(st.integers(1, 4)), group=draw(st.sampled_from((1, 2, 4, 8, 3))),
                  seq_lens=draw(_lengths(block)))
    elif name == "head-sizes":
        sizes = [h for h in (64, 128, 256, 512) if h in features.head_sizes]
        kw.update(step=draw(step), head_size=draw(st.sampled_from(sizes)), seq_lens=draw(_lengths(block, most=2)))
    elif name == "block-sizes":
        kw.update(step=draw(step), block_size=(b := draw(st.sampled_from(features.block_sizes))),
                  seq_lens=draw(_lengths(b, most=2)), shuffle=draw(st.integers(0, 9)))
    elif name == "sliding-window":
        kw.update(step=draw(step), sliding_window=draw(st.integers(1, 3 * block)),
                  seq_lens=draw(_lengths(block, max_blocks=4)))
    elif name == "kv-sharing":
        kw.update(step=draw(step), readers=draw(st.integers(2, 3)), seq_lens=draw(_lengths(block)),
                  sliding_window=draw(st.integers(0, 2 * block)) if features.sliding_window else 0)
    elif name == "cross-pools":
        lens = draw(_lengths(block))
        kw.update(step=draw(step), causal=False, seq_lens=lens,
                  q_lens=tuple(draw(st.integers(1, 8)) for _ in lens))
    elif name == "fp8-scales":
        fmt = draw(st.sampled_from([f for f in features.formats if f != "auto"]))
        scales = st.sampled_from((0.5, 2.0, 0.125, 4.0, 1.0))
        kw.update(step=draw(step), kv_cache_dtype=fmt, seq_lens=draw(_lengths(block)),
                  scale_placement=draw(st.sampled_from(features.placements)),
                  magnitude=draw(st.sampled_from((1.0, 16.0, 200.0))))
        if fmt == "fp8":
            kw.update(k_scale=draw(scales), v_scale=draw(scales))
    else:
        raise KeyError(name)
    if kw.get("step") == "context" and kw.get("causal", True):
        kw["q_lens"] = tuple(draw(st.integers(1, n)) for n in kw["seq_lens"])
    return KernelCase(**kw)
