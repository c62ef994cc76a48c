"""The KV-cache element formats: one table of every per-format fact, shared by the kernels, their references,
minikv's KVLayout and the quantization-aware training. See docs/internals.md#kernels-formats."""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .errors import InvalidTypeError, InvalidValueError

F16 = 0            # float16 elements, no scales            ("auto" with a float16 model)
BF16 = 1           # bfloat16 elements, no scales           ("auto" with a bfloat16 model)
F32 = 2            # float32 elements, no scales            ("auto" with a float32 model)
FP8 = 3            # float8 e4m3 elements, one scale per layer for K and one for V ("fp8")
INT8_PTH = 4       # int8 codes + inline fp32 scale per (token, kv head)   ("int8_per_token_head")
FP8_PTH = 5        # e4m3 codes + inline fp32 scale per (token, kv head)   ("fp8_per_token_head")

INT8_QMAX = 127.0
FP8_QMAX = 448.0
SCALE_EPS = 1e-8
SCALE_BYTES = 4                                    # an inline scale is one fp32
SCALE_REGION_ALIGN = 16                            # "block" placement: the scale region is padded to 16 bytes

# Where the per-token-head formats keep their fp32 scales (CacheSpec.placement; kernels: SCALE_PLACEMENT):
ROW = 0            # after each row's codes, as vLLM does: rows of head_size + 4 bytes   ("row", the default)
BLOCK = 1          # grouped after the codes of each block half: rows of head_size bytes ("block")
SCALE_PLACEMENTS = {"row": ROW, "block": BLOCK}
# Powers of two (tl.arange needs them); 256 and 512: gemma-4-E2B's sliding and full layers.
SUPPORTED_HEAD_SIZES = (16, 32, 64, 128, 256, 512)
# Tokens per cache block: powers of two (the kernels tile by them), from vLLM's usual sizes.
BLOCK_SIZES = (8, 16, 32, 64)
# "block" placement, heads above this size: each block's V codes stored transposed, tokens contiguous, the order
# P @ V contracts over (the head-512 decode 9-11% faster on an H100; at head 128 the transposed read was slower)
V_TRANSPOSED_ABOVE = 128


@dataclass(frozen=True)
class Format:
    """Everything that depends on the element format alone."""

    code: int
    name: str
    kv_cache_dtype: str               # the user-facing name that selects it ("auto" for the three 16/32-bit ones)
    elem_bytes: int
    code_dtype: torch.dtype           # the dtype of one stored element (the code, for quantized formats)
    qmax: float | None = None         # the largest code magnitude (quantized formats)
    inline_scales: bool = False       # an fp32 scale per (token, kv head) in the pool (where: CacheSpec.placement)
    layer_scales: bool = False        # one K and one V scale per layer, outside the pool


TABLE: dict[int, Format] = {f.code: f for f in (
    Format(F16, "float16", "auto", 2, torch.float16),
    Format(BF16, "bfloat16", "auto", 2, torch.bfloat16),
    Format(F32, "float32", "auto", 4, torch.float32),
    Format(FP8, "fp8", "fp8", 1, torch.float8_e4m3fn, qmax=FP8_QMAX, layer_scales=True),
    Format(INT8_PTH, "int8_per_token_head", "int8_per_token_head", 1, torch.int8, qmax=INT8_QMAX,
           inline_scales=True),
    Format(FP8_PTH, "fp8_per_token_head", "fp8_per_token_head", 1, torch.float8_e4m3fn, qmax=FP8_QMAX,
           inline_scales=True),
)}
NAMES = {code: f.name for code, f in TABLE.items()}
KV_CACHE_DTYPES = tuple(dict.fromkeys(f.kv_cache_dtype for f in TABLE.values()))   # auto, fp8, int8_pth, fp8_pth
PER_TOKEN_HEAD_KV_CACHE_DTYPES = tuple(dict.fromkeys(f.kv_cache_dtype for f in TABLE.values() if f.inline_scales))
LAYER_SCALE_KV_CACHE_DTYPES = tuple(dict.fromkeys(f.kv_cache_dtype for f in TABLE.values() if f.layer_scales))
AUTO_FORMATS = {f.code_dtype: code for code, f in TABLE.items() if f.kv_cache_dtype == "auto"}  # model dtype -> code


def check_kv_cache_dtype(kv_cache_dtype) -> None:
    """The one check of a kv_cache_dtype name (minikv's CacheConfig and KVLayout both call it)."""
    if not isinstance(kv_cache_dtype, str):
        raise InvalidTypeError(f"kv_cache_dtype must be a str, one of {', '.join(KV_CACHE_DTYPES)}; got "
                               f"{type(kv_cache_dtype).__name__} {kv_cache_dtype!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InvalidValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")


def format_of(kv_cache_dtype: str, model_dtype: torch.dtype) -> Format:
    """The format a cache of `kv_cache_dtype` holds for a model computing in `model_dtype`."""
    check_kv_cache_dtype(kv_cache_dtype)
    if model_dtype not in AUTO_FORMATS:
        raise InvalidValueError(f"model dtype must be float16, bfloat16 or float32, got {model_dtype}")
    if kv_cache_dtype == "auto":
        return TABLE[AUTO_FORMATS[model_dtype]]
    return next(f for f in TABLE.values() if f.kv_cache_dtype == kv_cache_dtype)


def check_scale_placement(scale_placement) -> None:
    """The one check of a scale placement name (minikv's CacheConfig and KVLayout both call it)."""
    if not isinstance(scale_placement, str):
        raise InvalidTypeError(f"kv_scale_placement must be a str, one of {', '.join(SCALE_PLACEMENTS)}; got "
                               f"{type(scale_placement).__name__} {scale_placement!r}")
    if scale_placement not in SCALE_PLACEMENTS:
        raise InvalidValueError(f"unknown kv_scale_placement {scale_placement!r}; choose one of "
                                f"{', '.join(SCALE_PLACEMENTS)}")


def check_block_size(block_size, name: str = "block_size") -> None:
    """The one block-size rule (minikv's CacheConfig and every CacheSpec call it)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise InvalidTypeError(f"{name} must be an int, one of {', '.join(map(str, BLOCK_SIZES))}; got "
                               f"{type(block_size).__name__} {block_size!r}")
    if block_size not in BLOCK_SIZES:
        raise InvalidValueError(f"{name} must be one of {', '.join(map(str, BLOCK_SIZES))} tokens, got {block_size}")


def check_head_size(head_size) -> None:
    """The one head-size rule of the paged kernels (every CacheSpec calls it)."""
    if isinstance(head_size, bool) or not isinstance(head_size, int) or head_size not in SUPPORTED_HEAD_SIZES:
        raise InvalidValueError(f"unsupported head size {head_size!r}; minikv's paged kernels take "
                                f"{', '.join(map(str, SUPPORTED_HEAD_SIZES))}")


def has_inline_scales(fmt: int) -> bool:
    return TABLE[fmt].inline_scales


def qmax(fmt: int) -> float:
    q = TABLE[fmt].qmax
    if q is None:
        raise InvalidValueError(f"format {NAMES[fmt]} is not quantized")
    return q


@dataclass(frozen=True)
class CacheSpec:
    """How a kernel addresses a pool: byte counts relative to the pool's first byte."""

    fmt: int
    elem_bytes: int
    head_size: int
    num_kv_heads: int
    block_size: int
    row_bytes: int
    slot_bytes: int
    kv_bytes: int
    block_bytes: int
    scale_offset: int
    scale_slot_bytes: int
    scale_head_bytes: int
    placement: int                    # ROW or BLOCK: where the scales sit (kernels take it as SCALE_PLACEMENT)

    @classmethod
    def of(cls, spec) -> CacheSpec:
        """A CacheSpec from any object carrying the same fields, or a `.spec` that is one."""
        if isinstance(spec, cls):
            return spec
        if isinstance(getattr(spec, "spec", None), cls):
            return spec.spec
        missing = [f for f in SPEC_FIELDS if not hasattr(spec, f)]
        if missing:
            raise InvalidTypeError(f"spec {type(spec).__name__} lacks the field(s) {missing}; a spec needs {SPEC_FIELDS} "
                                   f"(minikv.cache.layout.KVLayout is one)")
        return cls(**{f: getattr(spec, f) for f in SPEC_FIELDS})

    def __post_init__(self):
        for f in SPEC_FIELDS:
            if isinstance(getattr(self, f), bool) or not isinstance(getattr(self, f), int):
                raise InvalidTypeError(f"spec.{f} must be an int, got {getattr(self, f)!r}")
        if self.fmt not in TABLE:
            raise InvalidValueError(f"unknown cache format code {self.fmt}; known: {NAMES}")
        check_head_size(self.head_size)
        check_block_size(self.block_size, "spec.block_size")
        if self.elem_bytes != TABLE[self.fmt].elem_bytes:
            raise InvalidValueError(f"spec.elem_bytes={self.elem_bytes} does not match format {NAMES[self.fmt]} "
                                    f"({TABLE[self.fmt].elem_bytes} byte(s) per element)")
        if self.num_kv_heads < 1:
            raise InvalidValueError(f"spec.num_kv_heads must be at least 1, got {self.num_kv_heads}")
        if self.placement not in SCALE_PLACEMENTS.values():
            raise InvalidValueError(f"spec.placement must be formats.ROW ({ROW}) or formats.BLOCK ({BLOCK}), got "
                                    f"{self.placement!r}")
        inline = has_inline_scales(self.fmt)
        align = SCALE_BYTES if inline else self.elem_bytes
        for f in ("row_bytes", "slot_bytes", "kv_bytes", "block_bytes"):
            if getattr(self, f) <= 0 or getattr(self, f) % align:
                raise InvalidValueError(f"spec.{f}={getattr(self, f)} must be a positive multiple of {align}")
        code_bytes = self.head_size * self.elem_bytes
        if code_bytes > self.row_bytes:
            raise InvalidValueError(f"a {self.head_size}-element head does not fit a {self.row_bytes}-byte row")
        if not inline:
            if self.placement != ROW:
                raise InvalidValueError(f"{NAMES[self.fmt]} has no scales to place; its spec.placement must be ROW")
            return
        for f in ("scale_offset", "scale_slot_bytes", "scale_head_bytes"):
            if getattr(self, f) <= 0 or getattr(self, f) % SCALE_BYTES:
                raise InvalidValueError(f"spec.{f}={getattr(self, f)} must be a positive multiple of {SCALE_BYTES}")
        if self.placement == ROW:
            if self.scale_offset < code_bytes:
                raise InvalidValueError(f"spec.scale_offset={self.scale_offset} must be a 4-byte aligned offset after the "
                                        f"row's {code_bytes} code bytes")
            if self.scale_offset + SCALE_BYTES > self.row_bytes:
                raise InvalidValueError(f"inline scale at byte {self.scale_offset} does not fit a {self.row_bytes}-byte row")
        else:
            last = (self.scale_offset + (self.block_size - 1) * self.scale_slot_bytes
                    + (self.num_kv_heads - 1) * self.scale_head_bytes + SCALE_BYTES)
            if self.scale_offset < self.block_size * self.slot_bytes or last > self.kv_bytes:
                raise InvalidValueError(f"the scale region at byte {self.scale_offset} must lie after the half's "
                                        f"{self.block_size * self.slot_bytes} code bytes and inside its {self.kv_bytes}")


SPEC_FIELDS = tuple(f.name for f in fields(CacheSpec))
