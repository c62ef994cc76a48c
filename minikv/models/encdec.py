"""tiny-encdec: a T5-like encoder-decoder (bidirectional encoder, causal decoder with cross-attention).

The encoder is always dense and never touches the KV cache: it calls `dense_attention` directly, so it behaves
the same inside or outside the engine's forward context. Its input is the prompt's characters with no special
tokens, and each token gets two learned position embeddings, counted from the start and from the end of its
sequence (a tiny model learns string reversal quickly with both).

The decoder starts from [BOS]. Each decoder layer has causal self-attention (RoPE; paged by the engine) and
cross-attention over the encoder output (the engine's cross pool), then a gated MLP.

* dense mode (no forward context): `decode(input_ids [B, T], positions [B, T], encoder_out [B, S, H],
  encoder_mask [B, S])`.
* engine mode: `input_ids` and `positions` are flattened [T]. At the context step `encoder_out` is the flattened
  encoder output [S_total, H]: cross layers project K/V from it and hand them to their Attention op, which
  writes the cross pool. At decode steps `encoder_out` is None: cross layers call the op with k = v = None and
  the engine reads the cross pool.

`kv_transform`, when set, fake-quantizes every K/V tensor handed to a paged op in dense mode (decoder self and
cross attention; the encoder's own attention is never cached, so it is left alone).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from minikv.config import ModelConfig
from minikv.models.layers import Attention, GatedMLP, RMSNorm, check_token_inputs, dense_attention, rotary


def self_attn_name(index: int) -> str:
    return f"decoder.{index}.self_attn"


def cross_attn_name(index: int) -> str:
    return f"decoder.{index}.cross_attn"


class _Projections(nn.Module):
    """q/k/v/o projections with RMSNorm on each query and key head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_size = config.num_heads, config.num_kv_heads, config.head_size
        hidden, q_dim = config.hidden_size, config.num_heads * config.head_size
        kv_dim = config.num_kv_heads * config.head_size
        self.q_proj = nn.Linear(hidden, q_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, hidden, bias=False)
        self.q_norm = RMSNorm(config.head_size)
        self.k_norm = RMSNorm(config.head_size)

    def query(self, h):
        return self.q_norm(self.q_proj(h).view(*h.shape[:-1], self.num_heads, self.head_size))

    def key_value(self, h):
        k = self.k_norm(self.k_proj(h).view(*h.shape[:-1], self.num_kv_heads, self.head_size))
        v = self.v_proj(h).view(*h.shape[:-1], self.num_kv_heads, self.head_size)
        return k, v

    def output(self, out):
        return self.o_proj(out.reshape(*out.shape[:-2], -1))


class EncoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size)
        self.attn = _Projections(config)
        self.mlp_norm = RMSNorm(config.hidden_size)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, key_mask):
        h = self.attn_norm(x)
        k, v = self.attn.key_value(h)
        x = x + self.attn.output(dense_attention(self.attn.query(h), k, v, causal=False, key_mask=key_mask))
        return x + self.mlp(self.mlp_norm(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.rope_theta = config.rope_theta
        heads = (config.num_heads, config.num_kv_heads, config.head_size)
        self.self_norm = RMSNorm(config.hidden_size)
        self.self_proj = _Projections(config)
        self.self_attn = Attention(self_attn_name(index), *heads, kind="self")
        self.cross_norm = RMSNorm(config.hidden_size)
        self.cross_proj = _Projections(config)
        self.cross_attn = Attention(cross_attn_name(index), *heads, kind="cross")
        self.mlp_norm = RMSNorm(config.hidden_size)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, positions, encoder_out, encoder_mask, kv_transform, engine):
        transform = kv_transform if kv_transform is not None and not engine else (lambda t: t)

        h = self.self_norm(x)
        q = rotary(self.self_proj.query(h), positions, self.rope_theta)
        k, v = self.self_proj.key_value(h)
        k = rotary(k, positions, self.rope_theta)
        x = x + self.self_proj.output(self.self_attn(q, transform(k), transform(v)))

        h = self.cross_norm(x)
        q = self.cross_proj.query(h)
        if encoder_out is None:
            if not engine:
                raise ValueError("dense decode needs encoder_out")
            out = self.cross_attn(q, None, None)            # the engine reads the cross pool
        else:
            k, v = self.cross_proj.key_value(encoder_out)
            out = self.cross_attn(q, transform(k), transform(v), key_mask=None if engine else encoder_mask)
        x = x + self.cross_proj.output(out)
        return x + self.mlp(self.mlp_norm(x))


class EncDecModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        if not config.is_encoder_decoder or config.num_encoder_layers < 1 or config.max_encoder_len < 1:
            raise ValueError(f"{config.name} is not an encoder-decoder config")
        self.config = config
        hidden = config.hidden_size
        self.embed = nn.Embedding(config.vocab_size, hidden)
        self.enc_pos_from_start = nn.Embedding(config.max_encoder_len, hidden)
        self.enc_pos_from_end = nn.Embedding(config.max_encoder_len, hidden)
        self.encoder = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_encoder_layers))
        self.encoder_norm = RMSNorm(hidden)
        self.dec_pos = nn.Embedding(config.max_position, hidden)
        self.decoder = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.final_norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)
        self.kv_transform: Callable | None = None

    def attention_layers(self) -> list[Attention]:
        """Every paged op, decoder self-attention layers first, then cross-attention layers."""
        return [layer.self_attn for layer in self.decoder] + [layer.cross_attn for layer in self.decoder]

    def encode(self, input_ids: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Encoder output [B, S, H]. key_mask: bool [B, S], True on real tokens (one contiguous run per row)."""
        if input_ids.dim() != 2:
            raise ValueError(f"encode takes input_ids [B, S], got shape {tuple(input_ids.shape)}")
        if key_mask is None:
            key_mask = torch.ones_like(input_ids, dtype=torch.bool)
        if key_mask.shape != input_ids.shape or key_mask.dtype != torch.bool:
            raise ValueError(f"key_mask must be a bool tensor shaped like input_ids {tuple(input_ids.shape)}, "
                             f"got {key_mask.dtype} {tuple(key_mask.shape)}")
        lengths = key_mask.sum(dim=1, keepdim=True)
        if int(lengths.max()) > self.config.max_encoder_len:
            raise ValueError(f"encoder input of {int(lengths.max())} tokens is longer than max_encoder_len "
                             f"{self.config.max_encoder_len}")
        from_start = (key_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        from_end = (lengths - 1 - from_start).clamp(min=0)
        x = self.embed(input_ids) + self.enc_pos_from_start(from_start) + self.enc_pos_from_end(from_end)
        for layer in self.encoder:
            x = layer(x, key_mask)
        return self.encoder_norm(x)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, encoder_out: torch.Tensor | None = None,
               encoder_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed decoder hidden states: [B, T, H] dense, [T, H] in engine mode."""
        engine = check_token_inputs(input_ids, positions)
        if positions.numel() and int(positions.max()) >= self.config.max_position:
            raise ValueError(f"decoder position {int(positions.max())} is beyond max_position "
                             f"{self.config.max_position}")
        x = self.embed(input_ids) + self.dec_pos(positions)
        for layer in self.decoder:
            x = layer(x, positions, encoder_out, encoder_mask, self.kv_transform, engine)
        return self.final_norm(x)

    def forward(self, input_ids, positions, encoder_out=None, encoder_mask=None):
        return self.decode(input_ids, positions, encoder_out, encoder_mask)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
