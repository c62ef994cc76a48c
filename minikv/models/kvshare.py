"""tiny-kvshare: a decoder-only transformer whose last layers reuse the KV cache of earlier layers.

Each layer is pre-norm attention + gated MLP, with RoPE, RMSNorm on queries and keys, and grouped-query attention.
A KV-sharing layer (as in Gemma 3n) has a query projection but no key/value projections: it attends over the
keys and values its target layer produced. `config.kv_sharing = {4: 2, 5: 3}` means layer 4 reads layer 2's cache
and layer 5 reads layer 3's.

Two ways to run it:

* dense (no forward context; training and the golden reference): `input_ids` and `positions` are [B, T]; a
  KV-sharing layer attends over the K/V its target computed earlier in the same forward pass.
* engine (inside `set_forward_context`): `input_ids` and `positions` are [T], the flattened tokens of several
  sequences. Owner layers hand fresh K/V to their Attention op, which writes and reads the paged cache; a
  KV-sharing layer calls its op with k = v = None and the engine reads the target's cache.

`kv_transform` (None by default) is applied to every K and V tensor a layer hands to attention in dense mode;
training and the dense evaluation set it to fake-quantize K/V the way the engine's quantized caches would.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from minikv.config import ModelConfig
from minikv.models.layers import Attention, GatedMLP, RMSNorm, check_token_inputs, rotary


def layer_name(index: int) -> str:
    """Name of a decoder layer's Attention op (the key the engine binds caches by)."""
    return f"layers.{index}.self_attn"


class KVShareLayer(nn.Module):
    def __init__(self, config: ModelConfig, index: int):
        super().__init__()
        self.index = index
        self.num_heads, self.num_kv_heads, self.head_size = config.num_heads, config.num_kv_heads, config.head_size
        self.rope_theta = config.rope_theta
        self.kv_target = config.kv_sharing.get(index)      # None: this layer owns its K/V
        hidden, q_dim, kv_dim = config.hidden_size, config.num_heads * config.head_size, \
            config.num_kv_heads * config.head_size

        self.attn_norm = RMSNorm(hidden)
        self.q_proj = nn.Linear(hidden, q_dim, bias=False)
        self.q_norm = RMSNorm(config.head_size)
        if self.kv_target is None:
            self.k_proj = nn.Linear(hidden, kv_dim, bias=False)
            self.v_proj = nn.Linear(hidden, kv_dim, bias=False)
            self.k_norm = RMSNorm(config.head_size)
        self.o_proj = nn.Linear(q_dim, hidden, bias=False)
        self.attn = Attention(
            layer_name(index), config.num_heads, config.num_kv_heads, config.head_size, kind="self",
            kv_sharing_target=None if self.kv_target is None else layer_name(self.kv_target),
        )
        self.mlp_norm = RMSNorm(hidden)
        self.mlp = GatedMLP(hidden, config.intermediate_size)

    def forward(self, x, positions, produced_kv: dict, kv_transform: Callable | None, engine: bool):
        h = self.attn_norm(x)
        heads = h.shape[:-1]
        q = rotary(self.q_norm(self.q_proj(h).view(*heads, self.num_heads, self.head_size)),
                   positions, self.rope_theta)
        if self.kv_target is None:
            k = self.k_proj(h).view(*heads, self.num_kv_heads, self.head_size)
            k = rotary(self.k_norm(k), positions, self.rope_theta)
            v = self.v_proj(h).view(*heads, self.num_kv_heads, self.head_size)
            if kv_transform is not None and not engine:
                k, v = kv_transform(k), kv_transform(v)
            produced_kv[self.index] = (k, v)
        elif engine:
            k = v = None                                   # the engine reads the target layer's cache
        else:
            k, v = produced_kv[self.kv_target]
        out = self.attn(q, k, v)
        x = x + self.o_proj(out.reshape(*heads, -1))
        return x + self.mlp(self.mlp_norm(x))


class KVShareModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        if config.is_encoder_decoder:
            raise ValueError(f"{config.name} is an encoder-decoder config; KVShareModel is decoder-only")
        for layer, target in config.kv_sharing.items():
            if not 0 <= target < layer < config.num_layers or target in config.kv_sharing:
                raise ValueError(f"kv_sharing {layer}->{target}: a layer can only read the cache of an earlier "
                                 f"layer that owns its K/V")
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(KVShareLayer(config, i) for i in range(config.num_layers))
        self.final_norm = RMSNorm(config.hidden_size)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.kv_transform: Callable | None = None

    def attention_layers(self) -> list[Attention]:
        return [layer.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states: [B, T, H] in dense mode, [T, H] in engine mode."""
        engine = check_token_inputs(input_ids, positions)
        x = self.embed(input_ids)
        produced_kv: dict = {}
        for layer in self.layers:
            x = layer(x, positions, produced_kv, self.kv_transform, engine)
        return self.final_norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
