"""The reference the `matches-reference` oracle compares with: the model run densely, without the engine.
See docs/internals.md#hunt-reference."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .scenario import torch_dtype

MAX_TOKENS = 8
# A divergence is a near tie when the reference prefers its token over the engine's by at most this many logits:
# there, computing in another order may swap the two. The shipped models decide every held-out token of the
# prompt pool by a wider margin, in every format (results/hunt.json, docs/hunt.md).
TIE_MARGIN = 1.0
# How far the engine's logits may lie from the dense reference's with the same context, per (KV cache format,
# activation dtype): the largest |engine - reference| over a row, divided by the row's largest |logit| (at least 1).
# Calibrated on the fixed engine (`minikv hunt --every-defect` records the largest deviation it saw, results/hunt.json
# "calibration"): the shipped models and random-weight Gemma-4 and T5 checkpoints (tests/test_checkpoint_dirs.py)
# stay below 5e-2 in float16, below 1.2e-3 in float32 with a quantized cache (a quantization code may round the
# other way) and below 4e-6 with a 16-bit one; each bound here is about twice that, so on unquantized float32 cells
# the check is tight. A defect that shifts attention without flipping a greedy token still leaves these bounds.
LOGIT_TOLERANCE = {("auto", "float32"): 1e-4, ("fp8", "float32"): 2.5e-3, ("int8_per_token_head", "float32"): 2.5e-3,
                   ("fp8_per_token_head", "float32"): 2.5e-3, ("auto", "float16"): 1e-1, ("fp8", "float16"): 1e-1,
                   ("int8_per_token_head", "float16"): 1e-1, ("fp8_per_token_head", "float16"): 1e-1}


def logit_deviation(engine_row: torch.Tensor, reference_row: torch.Tensor) -> float:
    """The largest |engine - reference| over a row of logits, relative to the row's largest |logit| (at least 1)."""
    return float((engine_row - reference_row).abs().max()) / max(1.0, float(reference_row.abs().max()))


@dataclass(frozen=True)
class Reference:
    token_ids: tuple[int, ...]            # the greedy tokens, ending with EOS where the model stops
    logits: tuple[torch.Tensor, ...]      # float32 [vocab] before each token
    stopped: bool = False                 # the last token is EOS: there is nothing after it

    def margin(self, position: int, other: int) -> float:
        """How many logits the reference's token at `position` beats `other` by."""
        return self.gap(position, self.token_ids[position], other)

    def gap(self, position: int, a: int, b: int) -> float:
        """How many logits token `a` beats token `b` by, at `position` of the reference."""
        row = self.logits[position]
        return float(row[a] - row[b])


class DenseReference:
    """Greedy references from the dense model, cached."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._models: dict = {}
        self._cache: dict = {}

    def _model(self, name: str, dtype: str):
        from minikv.models import registry
        key = (name, dtype)
        if key not in self._models:
            self._models[key] = (registry.load_model(name, device=self.device, dtype=torch_dtype(dtype)).eval(),
                                 registry.get_tokenizer(name))
        return self._models[key]

    def get(self, model: str, kv_cache_dtype: str, dtype: str, prompt: str,
            max_tokens: int = MAX_TOKENS) -> Reference:
        """The reference for `prompt`: at least `max_tokens` tokens, or fewer ending with EOS."""
        key = (model, kv_cache_dtype, dtype, prompt)
        known = self._cache.get(key)
        if known is None or (len(known.token_ids) < max_tokens and not known.stopped):
            self._cache[key] = self._decode(model, kv_cache_dtype, dtype, prompt, max(max_tokens, 1))
        return self._cache[key]

    @torch.no_grad()
    def _decode(self, name: str, kv_cache_dtype: str, dtype: str, prompt: str, max_tokens: int) -> Reference:
        from minikv.models import train
        net, tok = self._model(name, dtype)
        previous = net.kv_transform
        net.kv_transform = train.kv_transform_for(None if kv_cache_dtype == "auto" else kv_cache_dtype)
        try:
            # The model's own greedy decoding picks the tokens; one more forward pass over the whole sequence
            # gives the logits before each of them (for the near-tie margins).
            if net.config.is_encoder_decoder:
                enc_ids = torch.tensor([tok.encode(prompt)], device=self.device)
                ids = net.greedy(enc_ids, max_tokens)[0].tolist()
                ids = ids[: ids.index(tok.eos_id) + 1] if tok.eos_id in ids else ids
                start = [net.config.decoder_start_token_id]
                dec = torch.tensor([start + ids[:-1]], device=self.device)
                logits = net.compute_logits(net.decode(dec, net.encode(enc_ids)))[0]
            else:
                prompt_ids = [tok.bos_id] + tok.encode(prompt)
                ids = net.greedy(torch.tensor([prompt_ids], device=self.device), max_tokens)[0].tolist()
                ids = ids[: ids.index(tok.eos_id) + 1] if tok.eos_id in ids else ids
                full = torch.tensor([prompt_ids + ids[:-1]], device=self.device)
                logits = net.logits(full)[0, len(prompt_ids) - 1:]
        finally:
            net.kv_transform = previous
        return Reference(tuple(ids), tuple(logits.float().cpu()), stopped=ids[-1] == tok.eos_id)


def calibrate(reference: DenseReference, cells, prompts) -> tuple[float, float]:
    """(smallest reference margin, largest float16/float32 logit difference): TIE_MARGIN's bounds."""
    margin, gap = float("inf"), 0.0
    for model, fmt in dict.fromkeys((c[0], c[1]) for c in cells):
        for prompt in prompts(model):
            half, full = reference.get(model, fmt, "float16", prompt), reference.get(model, fmt, "float32", prompt)
            for ref in (half, full):
                for row, token in zip(ref.logits, ref.token_ids):
                    margin = min(margin, float(row[token] - row.topk(2).values[1]))
            for a, b, ta, tb in zip(half.logits, full.logits, half.token_ids, full.token_ids):
                gap = max(gap, float((a - b).abs().max()))
                if ta != tb:
                    break
    return margin, gap
