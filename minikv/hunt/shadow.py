"""Kernels against their references, inside a real run: the `kernels-match-references` oracle's evidence.
See docs/internals.md#hunt-shadow."""
from __future__ import annotations

import inspect

import torch

from .seams import KERNEL_OPS, wrap_kernel_op

REFERENCES = {"write_kv": "write_kv_reference", "decode": "paged_decode_attention_reference",
              "context": "context_attention_reference", "paged_context": "paged_context_attention_reference"}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 4e-2}


class KernelShadow:
    def __init__(self, llm):
        from minikv import kernels
        self.mismatches: list[str] = []      # "op: what differed", one per disagreeing call
        self.calls = 0
        for op in KERNEL_OPS:
            reference = getattr(kernels, REFERENCES[op])
            wrap_kernel_op(llm, op, lambda kernel, op=op, reference=reference: self._shadowed(op, kernel, reference))

    def _shadowed(self, op: str, kernel, reference):
        signature = inspect.signature(reference)

        def call(*args, **kwargs):
            self.calls += 1
            if op == "write_kv":
                bound = signature.bind(*args, **kwargs)
                copy = bound.arguments["pool"].clone()
                result = kernel(*args, **kwargs)
                bound.arguments["pool"] = copy
                reference(*bound.args, **bound.kwargs)
                if not torch.equal(copy, signature.bind(*args, **kwargs).arguments["pool"]):
                    self.mismatches.append("write_kv: the bytes written differ from the reference writer's")
                return result
            result = kernel(*args, **kwargs)
            expected = reference(*args, **kwargs)
            tol = TOLERANCE.get(result.dtype, 1e-2)
            if not torch.allclose(result.float(), expected.float(), atol=tol, rtol=tol):
                self.mismatches.append(f"{op}: the output is outside the {result.dtype} tolerance of the reference")
            return result
        return call
