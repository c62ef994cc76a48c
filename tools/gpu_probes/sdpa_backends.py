"""Which of torch's SDPA backends gives the figure the context kernel is compared with (the bench's causal prefill,
8 prompts x 4,096 tokens, 32 query / 8 KV heads of 128), on a CUDA machine:

    python tools/gpu_probes/sdpa_backends.py

Each backend forced in turn with and without enable_gqa (K/V repeated to 32 heads instead); CUDA-graph replay, L2
flushed (minikv.bench.attention.cuda_time_ms).
"""
import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from minikv.bench.attention import cuda_time_ms

torch.manual_seed(0)
P, T, HQ, HKV, D = 8, 4096, 32, 8, 128
q = torch.randn(P, HQ, T, D, dtype=torch.bfloat16, device="cuda")
k = torch.randn(P, HKV, T, D, dtype=torch.bfloat16, device="cuda")
v = torch.randn_like(k)
flops = 4 * P * HQ * D * T * (T + 1) / 2
print(torch.__version__, torch.cuda.get_device_name())
for name in ("default", "CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
    for gqa in (True, False):
        kk, vv = (k, v) if gqa else (k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1))
        f = functools.partial(F.scaled_dot_product_attention, q, kk, vv, is_causal=True, enable_gqa=gqa)
        try:
            if name == "default":
                us = 1e3 * cuda_time_ms(f, reps=10).ms
            else:
                with sdpa_kernel(getattr(SDPBackend, name)):
                    us = 1e3 * cuda_time_ms(f, reps=10).ms
            print(f"{name:20s} enable_gqa={gqa!s:5s} {us:9.1f} us {flops / us / 1e6:6.1f} TFLOP/s", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"{name:20s} enable_gqa={gqa!s:5s} {type(exc).__name__}: {str(exc)[:150]}", flush=True)
