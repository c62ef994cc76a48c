"""The reference the `matches-reference` oracle compares with: the model run densely in float64, without the engine.
See docs/internals.md#hunt-reference."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import logit_tolerance as tol
from .scenario import torch_dtype

MAX_TOKENS = 8


@dataclass(frozen=True)
class Reference:
    token_ids: tuple[int, ...]            # the greedy tokens, ending with EOS where the model stops
    logits: tuple[torch.Tensor, ...]      # float64 [vocab] before each token
    stopped: bool = False                 # the last token is EOS: there is nothing after it
    tolerance: tuple[float, ...] = ()     # per row: how far (in logits) a correct engine's row may lie from it
    terms: tuple = ()                     # per row: the tolerance's terms (logit_tolerance.Terms)

    def margin(self, position: int, other: int) -> float:
        """How many logits the reference's token at `position` beats `other` by."""
        return self.gap(position, self.token_ids[position], other)

    def gap(self, position: int, a: int, b: int) -> float:
        """How many logits token `a` beats token `b` by, at `position` of the reference."""
        row = self.logits[position]
        return float(row[a] - row[b])

    def allowed(self, position: int) -> float:
        """The tolerance of row `position`, in logits (0 where none was given: the row must match exactly)."""
        return self.tolerance[position] if position < len(self.tolerance) else 0.0


@dataclass
class _Dense:
    """One float64 greedy decode: tokens, logits, and per row the sizes its tolerance is computed from."""
    token_ids: tuple[int, ...]
    logits: torch.Tensor                  # float64 [tokens, vocab]
    stopped: bool
    bound: tuple[float, ...]              # per row: max_v |W_v| |h|, the largest any logit can be
    depth: tuple[int, int]                # (layers, the longest dot product): logit_tolerance.gamma's L and n
    hidden: object                        # (model, batch) -> final hidden states [batch, tokens, H], same sequence
    measured: dict                        # activation dtype -> per row: (own run, flips, spread) moves


class DenseReference:
    """Greedy references from the dense model in float64, cached."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self._models: dict = {}
        self._cache: dict = {}

    def _model(self, name: str, dtype: torch.dtype = torch.float64):
        from minikv.models import registry
        if (name, dtype) not in self._models:
            self._models[name, dtype] = registry.load_model(name, device=self.device, dtype=dtype).eval()
        return self._models[name, dtype]

    def get(self, model: str, kv_cache_dtype: str, dtype: str, prompt: str,
            max_tokens: int = MAX_TOKENS) -> Reference:
        """The reference for `prompt`, to compare an engine computing in `dtype` with: at least `max_tokens`
        tokens, or fewer ending with EOS."""
        key = (model, kv_cache_dtype, prompt)
        known = self._cache.get(key)
        if known is None or (len(known.token_ids) < max_tokens and not known.stopped):
            self._cache[key] = known = self._decode(model, kv_cache_dtype, prompt, max(max_tokens, 1))
        if dtype not in known.measured:
            known.measured[dtype] = self._measure(model, kv_cache_dtype, dtype, known)
        terms = tuple(tol.terms(dtype, *known.depth, *m) for m in zip(known.bound, *known.measured[dtype]))
        return Reference(known.token_ids, tuple(known.logits), known.stopped, tuple(t.total for t in terms), terms)

    @torch.no_grad()
    def _decode(self, name: str, kv_cache_dtype: str, prompt: str, max_tokens: int) -> _Dense:
        from minikv.models import registry, train
        net, tok = self._model(name), registry.get_tokenizer(name)
        net.kv_transform = train.kv_transform_for(None if kv_cache_dtype == "auto" else kv_cache_dtype)
        # The model's own greedy decoding picks the tokens; one more forward pass over the whole sequence
        # gives the logits before each of them, and the final hidden states they come from.
        if net.config.is_encoder_decoder:
            enc_ids = torch.tensor([tok.encode(prompt)], device=self.device)
            ids = net.greedy(enc_ids, max_tokens)[0].tolist()
            ids = ids[: ids.index(tok.eos_id) + 1] if tok.eos_id in ids else ids
            dec = torch.tensor([[net.config.decoder_start_token_id] + ids[:-1]], device=self.device)

            def hidden(m, batch=1):
                return m.decode(dec.expand(batch, -1), m.encode(enc_ids.expand(batch, -1)))
            layers = net.config.num_decoder_layers + net.config.num_layers
        else:
            prompt_ids = [tok.bos_id] + tok.encode(prompt)
            ids = net.greedy(torch.tensor([prompt_ids], device=self.device), max_tokens)[0].tolist()
            ids = ids[: ids.index(tok.eos_id) + 1] if tok.eos_id in ids else ids
            full = torch.tensor([prompt_ids + ids[:-1]], device=self.device)

            def hidden(m, batch=1):
                return m(full.expand(batch, -1))[:, len(prompt_ids) - 1:]
            layers = net.config.num_hidden_layers
        h = hidden(net)[0]
        net.kv_transform = None
        head = net.lm_head.weight.detach().norm(dim=-1).max()
        bound = head * _head_input(net, h).norm(dim=-1)
        inner = max(m.in_features for m in net.modules() if isinstance(m, torch.nn.Linear))
        return _Dense(tuple(ids), _logits(net, h).cpu(), ids[-1] == tok.eos_id, tuple(bound.tolist()),
                      (layers, inner), hidden, {})

    @torch.no_grad()
    def _measure(self, name: str, kv_cache_dtype: str, dtype: str, known: _Dense) -> tuple[list, list, list]:
        """Per row: how far the dense model's own run in `dtype` lies from the float64 reference; the sum over
        every group of K/V codes within reach of a boundary (logit_tolerance.FlipProbe) of how far the float64
        reference moves with that group flipped alone; the largest move over tol.SAMPLES runs of the float64 model
        rounding at random as `dtype` does (logit_tolerance.RandomRounding)."""
        from minikv.models import train
        fmt = None if kv_cache_dtype == "auto" else kv_cache_dtype
        quantize = train.kv_transform_for(fmt) or (lambda t: t)
        lower: list = []

        def keeping(t):                     # the K/V of the runs that round, in call order (a flip's reach)
            if fmt is not None:
                lower.append(t.double())
            return quantize(t)
        own = _logits_of(self._model(name, torch_dtype(dtype)), keeping, known)[0]
        own = (own - known.logits).abs().amax(-1)
        kv_own, lower[:] = list(lower), []
        with tol.RandomRounding(tol.UNIT_ROUNDOFF[dtype]):
            spread = _logits_of(self._model(name), keeping, known, tol.SAMPLES)
        spread = (spread - known.logits).abs().amax(-1).amax(0)
        if fmt is None:
            return own.tolist(), [0.0] * len(own), spread.tolist()
        probe = tol.FlipProbe(fmt, [torch.cat(pair) for pair in zip(kv_own, lower)])
        _logits_of(self._model(name), probe, known)               # finds the groups
        if not probe.groups:
            return own.tolist(), [0.0] * len(own), spread.tolist()
        logits = _logits_of(self._model(name), probe.flipping(), known, 1 + len(probe.groups))
        return own.tolist(), (logits[1:] - logits[0]).abs().amax(-1).sum(0).tolist(), spread.tolist()


def _logits_of(net, transform, known: _Dense, batch: int = 1) -> torch.Tensor:
    """float64 logits [batch, tokens, vocab] of `net` with `transform` on its K/V, over the reference's sequence."""
    net.kv_transform = transform
    try:
        return _logits(net, known.hidden(net, batch)).double().cpu()
    finally:
        net.kv_transform = None


def _head_input(net, hidden: torch.Tensor) -> torch.Tensor:
    """What the unembedding multiplies: the final hidden state, scaled where the model scales it (T5)."""
    if getattr(net.config, "scale_decoder_outputs", False):
        return hidden * net.config.d_model ** -0.5
    return hidden


def _logits(net, hidden: torch.Tensor) -> torch.Tensor:
    """float64 logits of float64 hidden states (the model's own head, soft-capping included, without its cast to
    float32)."""
    logits = net.lm_head(_head_input(net, hidden))
    cap = getattr(net.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap is not None else logits
