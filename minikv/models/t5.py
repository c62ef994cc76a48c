"""T5 (v1.1 / flan-t5 flavour) encoder-decoder, following transformers' `T5ForConditionalGeneration`.
See docs/internals.md#models-t5."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from minikv.kernels.errors import BadInputError
from minikv.models.layers import Attention, check_token_inputs

_ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


class T5ConfigError(BadInputError, ValueError):
    """A t5 config that minikv cannot run."""


@dataclass(frozen=True)
class T5Config:
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_decoder_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "gated-gelu"
    scale_decoder_outputs: bool = False      # original T5: True; v1.1 / flan-t5: False
    tie_lm_head: bool = False                # the LM head is the shared embedding (no lm_head.weight stored)
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    name: str = field(default="t5", compare=False)

    def __post_init__(self):
        parts = self.feed_forward_proj.split("-")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or self.activation not in _ACTIVATIONS:
            raise T5ConfigError(f"feed_forward_proj {self.feed_forward_proj!r} is not supported; use 'gated-gelu', "
                                f"'relu' or another '[gated-]ACT' with ACT in {', '.join(_ACTIVATIONS)}")

    @property
    def is_gated(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def activation(self) -> str:
        # transformers maps "gated-gelu" to the tanh-approximated GELU ("gelu_new"), for backward compatibility
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else self.feed_forward_proj.split("-")[-1]

    @classmethod
    def from_hf_dict(cls, d: dict, tie_lm_head: bool, name: str = "t5") -> T5Config:
        """Resolve a `t5` config.json as transformers does. `tie_lm_head` comes from the checkpoint (whether it
        stores a separate `lm_head.weight`), which is also how transformers decides."""
        if d.get("model_type", "t5") != "t5":
            raise T5ConfigError(f"expected model_type 't5', got {d.get('model_type')!r}")
        num_layers = d.get("num_layers", 6)
        scale = d["scale_decoder_outputs"] if "scale_decoder_outputs" in d else \
            d.get("tie_word_embeddings", True) is not False
        return cls(
            vocab_size=d.get("vocab_size", 32128), d_model=d.get("d_model", 512), d_kv=d.get("d_kv", 64),
            d_ff=d.get("d_ff", 2048), num_layers=num_layers,
            num_decoder_layers=d.get("num_decoder_layers") or num_layers, num_heads=d.get("num_heads", 8),
            relative_attention_num_buckets=d.get("relative_attention_num_buckets", 32),
            relative_attention_max_distance=d.get("relative_attention_max_distance", 128),
            layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-6), feed_forward_proj=d.get("feed_forward_proj", "relu"),
            scale_decoder_outputs=bool(scale), tie_lm_head=tie_lm_head, pad_token_id=d.get("pad_token_id", 0),
            eos_token_id=d.get("eos_token_id", 1),
            decoder_start_token_id=d.get("decoder_start_token_id", d.get("pad_token_id", 0)), name=name,
        )

    def to_hf_dict(self) -> dict:
        return {
            "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "is_encoder_decoder": True,
            "vocab_size": self.vocab_size, "d_model": self.d_model, "d_kv": self.d_kv, "d_ff": self.d_ff,
            "num_layers": self.num_layers, "num_decoder_layers": self.num_decoder_layers,
            "num_heads": self.num_heads, "relative_attention_num_buckets": self.relative_attention_num_buckets,
            "relative_attention_max_distance": self.relative_attention_max_distance,
            "layer_norm_epsilon": self.layer_norm_epsilon, "feed_forward_proj": self.feed_forward_proj,
            "tie_word_embeddings": self.tie_lm_head, "scale_decoder_outputs": self.scale_decoder_outputs,
            "pad_token_id": self.pad_token_id, "eos_token_id": self.eos_token_id,
            "decoder_start_token_id": self.decoder_start_token_id, "dropout_rate": 0.0,
        }

    # ---- what minikv's engine reads (the same names for every model) --------------------------------------------------
    is_encoder_decoder = True
    # T5 has no absolute positions and so no length limit of its own; the engine sizes its default pools (and
    # refuses longer requests) by these, T5's customary 512.
    max_position = 512
    max_encoder_len = 512

    @property
    def hidden_size(self) -> int:
        return self.d_model

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads

    @property
    def head_size(self) -> int:
        return self.d_kv

    @property
    def kv_sharing(self) -> dict[int, int]:
        return {}


def relative_position_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """Bucket of each relative distance (key position - query position), as Mesh TensorFlow defines it."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    log_part = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
    large = (exact + (log_part * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, large)


class T5LayerNorm(nn.Module):
    """RMS norm in float32; the result is cast to the weight's dtype only for 16-bit weights (as upstream)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(self.weight.dtype)
        return self.weight * x


class DenseKVCache:
    """Decoder self-attention K/V of every position so far, per layer ([B, heads, S, d_kv]), plus each layer's
    cross-attention K/V over the encoder output, computed once."""

    def __init__(self):
        self.self_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.cross_kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def length(self) -> int:
        return next(iter(self.self_kv.values()))[0].shape[2] if self.self_kv else 0


class T5Attention(nn.Module):
    """One T5 attention sublayer's projections; `op`: its paged attention op (decoder layers only; no parameters,
    so the state dict stays transformers')."""

    def __init__(self, config: T5Config, has_relative_bias: bool, op: Attention | None = None):
        super().__init__()
        self.op = op
        self.num_heads, self.d_kv = config.num_heads, config.d_kv
        inner = config.num_heads * config.d_kv
        self.q = nn.Linear(config.d_model, inner, bias=False)
        self.k = nn.Linear(config.d_model, inner, bias=False)
        self.v = nn.Linear(config.d_model, inner, bias=False)
        self.o = nn.Linear(inner, config.d_model, bias=False)
        if has_relative_bias:
            self.relative_attention_bias = nn.Embedding(config.relative_attention_num_buckets, config.num_heads)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], self.num_heads, self.d_kv).transpose(1, 2)

    def flat_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[T, heads * d_kv] -> [T, heads, d_kv], the engine's layout."""
        return x.view(x.shape[0], self.num_heads, self.d_kv)

    def engine_forward(self, x: torch.Tensor, kv_input: torch.Tensor | None, ctx,
                       rel_bias: torch.Tensor | None = None) -> torch.Tensor:
        """Engine mode: the flattened queries through this layer's paged op."""
        k = v = None
        if kv_input is not None:
            k, v = self.flat_heads(self.k(kv_input)), self.flat_heads(self.v(kv_input))
        out = self.op(self.flat_heads(self.q(x)), k, v, ctx, rel_bias=rel_bias)
        return self.o(out.reshape(x.shape[0], -1))

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """x: [B, T, d_model]; k, v: [B, heads, S, d_kv]; bias: additive, broadcastable to [B, heads, T, S]."""
        # Written out as transformers' eager T5 attention does it (scores in the model's dtype, softmax in float32,
        # no 1/sqrt(d) scaling), not through F.scaled_dot_product_attention: on an H200 its cuDNN backend returned
        # NaN for bfloat16 at flan-t5-base's head size 64 with the finfo.min masks used here.
        scores = torch.matmul(self.heads(self.q(x)), k.transpose(-1, -2)) + bias.to(x.dtype)
        weights = scores.float().softmax(dim=-1).to(scores.dtype)
        out = torch.matmul(weights, v)
        return self.o(out.transpose(1, 2).reshape(*x.shape[:-1], -1))


class T5FeedForward(nn.Module):
    """`DenseReluDense` upstream: wo(act(wi_0 x) * wi_1 x) when gated, wo(act(wi x)) otherwise."""

    def __init__(self, config: T5Config):
        super().__init__()
        self.gated = config.is_gated
        if self.gated:
            self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)
            self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        else:
            self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.act = _ACTIVATIONS[config.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.wi_0(x)) * self.wi_1(x) if self.gated else self.act(self.wi(x))
        return self.wo(h.to(self.wo.weight.dtype))


class _Sublayer(nn.Module):
    """One pre-norm residual sublayer; the attribute names are transformers' (SelfAttention, EncDecAttention,
    DenseReluDense)."""

    def __init__(self, config: T5Config, kind: str, has_relative_bias: bool = False, op: Attention | None = None):
        super().__init__()
        self.layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)
        inner = T5FeedForward(config) if kind == "DenseReluDense" else T5Attention(config, has_relative_bias, op)
        setattr(self, kind, inner)


def decoder_ops(config: T5Config, index: int) -> tuple[Attention, Attention]:
    """The paged attention ops of decoder layer `index`: self and cross attention, both without 1/sqrt(d)."""
    h, d = config.num_heads, config.d_kv
    return (Attention(f"decoder.{index}.self_attn", h, h, d, kind="self", sm_scale=1.0),
            Attention(f"decoder.{index}.cross_attn", h, h, d, kind="cross", sm_scale=1.0))


class T5Block(nn.Module):
    def __init__(self, config: T5Config, is_decoder: bool, index: int):
        super().__init__()
        self_op, cross_op = decoder_ops(config, index) if is_decoder else (None, None)
        subs = [_Sublayer(config, "SelfAttention", has_relative_bias=index == 0, op=self_op)]
        if is_decoder:
            subs.append(_Sublayer(config, "EncDecAttention", op=cross_op))
        subs.append(_Sublayer(config, "DenseReluDense"))
        self.layer = nn.ModuleList(subs)

    @property
    def self_attn(self) -> T5Attention:
        return self.layer[0].SelfAttention


class T5Stack(nn.Module):
    def __init__(self, config: T5Config, is_decoder: bool):
        super().__init__()
        self.config, self.is_decoder = config, is_decoder
        n = config.num_decoder_layers if is_decoder else config.num_layers
        self.block = nn.ModuleList(T5Block(config, is_decoder, i) for i in range(n))
        self.final_layer_norm = T5LayerNorm(config.d_model, config.layer_norm_epsilon)

    def position_bias(self, q_pos: torch.Tensor, num_keys: int) -> torch.Tensor:
        """[1, heads, T, S] from the first block's table; q_pos: [T] absolute query positions."""
        c = self.config
        relative = torch.arange(num_keys, device=q_pos.device)[None, :] - q_pos[:, None]
        buckets = relative_position_bucket(relative, not self.is_decoder, c.relative_attention_num_buckets,
                                           c.relative_attention_max_distance)
        return self.block[0].self_attn.relative_attention_bias(buckets).permute(2, 0, 1)[None]


def _key_mask_bias(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | float:
    """Additive [B, 1, 1, S] bias that hides keys where `mask` (bool [B, S]) is False."""
    if mask is None:
        return 0.0
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min)[:, None, None, :]


class T5ForConditionalGeneration(nn.Module):
    def __init__(self, config: T5Config):
        super().__init__()
        self.config = config
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = T5Stack(config, is_decoder=False)
        self.decoder = T5Stack(config, is_decoder=True)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_lm_head:
            self.lm_head.weight = self.shared.weight
        # Applied in decode() to the decoder's self and cross K/V (what a paged engine caches), e.g. to
        # fake-quantize them in training and the dense evaluation; None: untouched.
        self.kv_transform = None

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Encoder output [B, S, d_model]; attention_mask: bool [B, S], False for padding."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
        enc = self.encoder
        x = self.shared(input_ids)
        s = input_ids.shape[1]
        bias = enc.position_bias(torch.arange(s, device=x.device), s) + _key_mask_bias(attention_mask, x.dtype)
        for block in enc.block:
            attn, ff = block.layer[0], block.layer[-1]
            h = attn.layer_norm(x)
            x = x + attn.SelfAttention(h, attn.SelfAttention.heads(attn.SelfAttention.k(h)),
                                       attn.SelfAttention.heads(attn.SelfAttention.v(h)), bias)
            x = x + ff.DenseReluDense(ff.layer_norm(x))
        return enc.final_layer_norm(x)

    def decode(self, decoder_ids: torch.Tensor, encoder_out: torch.Tensor,
               encoder_mask: torch.Tensor | None = None, cache: DenseKVCache | None = None) -> torch.Tensor:
        """Final-normed decoder hidden states [B, T, d_model] for `decoder_ids` [B, T], which continue the
        cache's positions (0 without a cache)."""
        dec = self.decoder
        x = self.shared(decoder_ids)
        start, t = (cache.length if cache is not None else 0), decoder_ids.shape[1]
        q_pos = torch.arange(start, start + t, device=x.device)
        causal = torch.zeros(t, start + t, dtype=x.dtype, device=x.device).masked_fill(
            torch.arange(start + t, device=x.device)[None, :] > q_pos[:, None], torch.finfo(x.dtype).min)
        self_bias = dec.position_bias(q_pos, start + t) + causal
        cross_bias = torch.zeros((1, 1, 1, 1), dtype=x.dtype, device=x.device) + _key_mask_bias(encoder_mask, x.dtype)
        for i, block in enumerate(dec.block):
            attn, cross, ff = block.layer
            sa, ca = attn.SelfAttention, cross.EncDecAttention
            h = attn.layer_norm(x)
            k, v = sa.heads(sa.k(h)), sa.heads(sa.v(h))
            if self.kv_transform is not None:
                k, v = self.kv_transform(k), self.kv_transform(v)
            if cache is not None:
                if i in cache.self_kv:
                    k = torch.cat([cache.self_kv[i][0], k], dim=2)
                    v = torch.cat([cache.self_kv[i][1], v], dim=2)
                cache.self_kv[i] = (k, v)
            x = x + sa(h, k, v, self_bias)
            if cache is not None and i in cache.cross_kv:
                ck, cv = cache.cross_kv[i]
            else:
                ck, cv = ca.heads(ca.k(encoder_out)), ca.heads(ca.v(encoder_out))
                if self.kv_transform is not None:
                    ck, cv = self.kv_transform(ck), self.kv_transform(cv)
                if cache is not None:
                    cache.cross_kv[i] = (ck, cv)
            x = x + ca(cross.layer_norm(x), ck, cv, cross_bias)
            x = x + ff.DenseReluDense(ff.layer_norm(x))
        return dec.final_layer_norm(x)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, encoder_out: torch.Tensor | None = None,
                *, ctx=None) -> torch.Tensor:
        """Engine mode only, with the runner's per-step `ctx` (minikv.attention.context.ForwardContext):
        final-normed decoder hidden states [T, d_model] for flattened `input_ids` [T]."""
        if ctx is None:
            raise ValueError("T5's forward() is the engine's entry point (it needs the engine's ctx); in dense mode "
                             "call encode() and decode(), or greedy()")
        check_token_inputs(input_ids, positions, engine=True)
        rel_bias = self.decoder_bias_table()
        x = self.shared(input_ids)
        for block in self.decoder.block:
            attn, cross, ff = block.layer
            h = attn.layer_norm(x)
            x = x + attn.SelfAttention.engine_forward(h, h, ctx, rel_bias=rel_bias)
            x = x + cross.EncDecAttention.engine_forward(cross.layer_norm(x), encoder_out, ctx)
            x = x + ff.DenseReluDense(ff.layer_norm(x))
        return self.decoder.final_layer_norm(x)

    def decoder_bias_table(self) -> torch.Tensor:
        """The decoder's relative bias as the paged kernels take it: float32 [heads, max_distance + 1], column
        n the bias of a key n positions before its query (its causal bucket's row of the learned table)."""
        c = self.config
        table = self.decoder.block[0].self_attn.relative_attention_bias.weight
        distance = torch.arange(c.relative_attention_max_distance + 1, device=table.device)
        buckets = relative_position_bucket(-distance, False, c.relative_attention_num_buckets,
                                           c.relative_attention_max_distance)
        return table.detach()[buckets].t().float().contiguous()

    def attention_layers(self) -> list[Attention]:
        """The attention ops the engine binds an impl and a cache to: decoder self attention first, then cross."""
        return ([block.layer[0].SelfAttention.op for block in self.decoder.block]
                + [block.layer[1].EncDecAttention.op for block in self.decoder.block])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.config.scale_decoder_outputs:
            hidden = hidden * self.config.d_model ** -0.5
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Encode once, then decode one token at a time from the decoder start token; returns [B, N] new ids."""
        enc = self.encode(input_ids, attention_mask)
        cache = DenseKVCache()
        token = torch.full((input_ids.shape[0], 1), self.config.decoder_start_token_id, device=input_ids.device)
        out = []
        for _ in range(max_new_tokens):
            logits = self.compute_logits(self.decode(token, enc, attention_mask, cache))[:, -1]
            token = logits.argmax(-1, keepdim=True)
            out.append(token)
        return torch.cat(out, dim=1)
