"""Numeric codes for the KV-cache element formats, shared by every kernel and its reference.

The kernels import nothing from minikv. They receive the cache's addressing as a *spec*: any object with the
attributes listed in `SPEC_FIELDS` (minikv's `KVLayout` is one). These codes name the element format.
"""

F16 = 0            # float16 elements, no scales            ("auto" with a float16 model)
BF16 = 1           # bfloat16 elements, no scales           ("auto" with a bfloat16 model)
F32 = 2            # float32 elements, no scales            ("auto" with a float32 model)
FP8 = 3            # float8 e4m3 elements, one scale per layer for K and one for V ("fp8")
INT8_PTH = 4       # int8 codes + inline fp32 scale per (token, kv head)   ("int8_per_token_head")
FP8_PTH = 5        # e4m3 codes + inline fp32 scale per (token, kv head)   ("fp8_per_token_head")

NAMES = {F16: "float16", BF16: "bfloat16", F32: "float32", FP8: "fp8", INT8_PTH: "int8_per_token_head",
         FP8_PTH: "fp8_per_token_head"}

INT8_QMAX = 127.0
FP8_QMAX = 448.0
SCALE_EPS = 1e-8

# Attributes a cache spec must carry (all plain ints), all byte counts relative to the pool's first byte:
#   row (block b, K=0/V=1 half kv, slot-in-block o, kv head h) starts at
#       b * block_bytes + kv * kv_bytes + o * slot_bytes + h * row_bytes
#   its inline scale (per-token-head formats only) at row start + scale_offset.
SPEC_FIELDS = ("fmt", "elem_bytes", "head_size", "num_kv_heads", "block_size",
               "row_bytes", "slot_bytes", "kv_bytes", "block_bytes", "scale_offset")


def has_inline_scales(fmt: int) -> bool:
    return fmt in (INT8_PTH, FP8_PTH)


def qmax(fmt: int) -> float:
    return INT8_QMAX if fmt == INT8_PTH else FP8_QMAX
