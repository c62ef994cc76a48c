"""Gemma-4's text decoder (transformers' `Gemma4ForCausalLM` with a `gemma4_text` config), written for minikv.
See docs/internals.md#models-gemma4."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minikv.kernels.decode_matmul import decode_matmul
from minikv.kernels.mode import INTERPRETED
from minikv.kernels.rms_norm import rms_norm, rms_norm_reference
from minikv.models.gemma4_config import FULL, SLIDING, Gemma4Config, Gemma4ConfigError  # noqa: F401
from minikv.models.gemma4_dense import DenseKVCache, dense_attention
from minikv.models.layers import Attention, check_token_inputs

_ACTIVATIONS = {"gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "silu": F.silu,
                "relu": F.relu}


class Gemma4RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps), in float32, times `weight` (if any), in x's dtype."""

    def __init__(self, dim: int, eps: float = 1e-6, with_scale: bool = True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                sin: torch.Tensor | None = None, scale: torch.Tensor | None = None, then: Gemma4RMSNorm | None = None):
        """The norm; with `then` (the norm that reads the result next, with a weight and the same eps): (result,
        then(result)), from one launch where the kernel runs."""
        fused = kernels_run(x)
        if then is not None and not fused:
            out = self(x, residual, cos, sin, scale)
            return out, then(out)
        norm, pair = rms_norm if fused else rms_norm_reference, {} if then is None else {"next_weight": then.weight}
        return norm(x, self.weight, self.eps, residual=residual, cos=cos, sin=sin, scale=scale, validate=False, **pair)


def kernels_run(x: torch.Tensor) -> bool:
    """Whether the model's own kernels (fused norms and matmuls) run on x: compiled, and no autograd (they have no
    backward pass). Elsewhere the torch formulas run."""
    return x.is_cuda and not INTERPRETED and not torch.is_grad_enabled()


def fused_matmul(x: torch.Tensor, gate: nn.Linear, **second):
    """decode_matmul of x's rows (`second`: up= a Linear, times= a tensor like the result, stack= two Linears, or
    nothing), shaped like x; None where it does not run (kernels_run; a bias; weights not in x's dtype; too many
    rows): torch's steps then run."""
    linears = (gate, *(m for v in second.values() for m in (v if isinstance(v, tuple) else (v,))
                       if isinstance(m, nn.Linear)))
    if not kernels_run(x) or any(m.bias is not None or m.weight.dtype != x.dtype for m in linears):
        return None
    rows = x.reshape(-1, x.shape[-1])
    weight = lambda v: v.weight if isinstance(v, nn.Linear) else v.reshape(rows.shape[0], -1)
    second = {k: tuple(map(weight, v)) if isinstance(v, tuple) else weight(v) for k, v in second.items()}
    out = decode_matmul(rows, gate.weight, **second, validate=False)
    return out if out is None else out.view(*x.shape[:-1], out.shape[-1])


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """layer(x): decode_matmul's one-weight mode where fused_matmul runs (a Triton launch that waits on the one
    before it, see kernels/launch.py), else torch's."""
    out = fused_matmul(x, layer)
    return layer(x) if out is None else out


class ScaledEmbedding(nn.Embedding):
    """An embedding whose rows are multiplied by a constant rounded to the weight's dtype."""

    def __init__(self, num: int, dim: int, scale: float):
        super().__init__(num, dim)
        self.scale = scale
        self._scales: dict = {}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # made once per (device, dtype): a host-to-device copy cannot be captured in a CUDA graph
        key = (ids.device, self.weight.dtype)
        if key not in self._scales:
            self._scales[key] = torch.tensor(self.scale, dtype=torch.float32, device=ids.device).to(self.weight.dtype)
        return super().forward(ids) * self._scales[key]


def rope_inv_freq(rope: dict, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2] of one layer type."""
    theta = rope["rope_theta"]
    if rope.get("rope_type", "default") == "default":
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    rotated = int(rope.get("partial_rotary_factor", 1.0) * head_dim // 2)
    inv = 1.0 / (theta ** (torch.arange(0, 2 * rotated, 2, dtype=torch.float32) / head_dim))
    inv = torch.cat([inv, torch.zeros(head_dim // 2 - rotated)])
    return inv / rope.get("factor", 1.0)


def layer_name(index: int) -> str:
    """Name of a decoder layer's Attention op (the key the engine binds caches by)."""
    return f"model.layers.{index}.self_attn"


class Gemma4Attention(nn.Module):
    def __init__(self, config: Gemma4Config, index: int):
        super().__init__()
        self.index = index
        self.layer_type = config.layer_types[index]
        self.window = config.window(index)
        self.num_heads, self.head_dim = config.num_attention_heads, config.layer_head_dims[index]
        self.num_kv_heads = config.layer_kv_heads[index]
        self.kv_shared = config.is_kv_shared(index)
        h, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.q_norm = Gemma4RMSNorm(self.head_dim, config.rms_norm_eps)
        if not self.kv_shared:
            self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
            keys_are_values = config.attention_k_eq_v and self.layer_type == FULL
            self.v_proj = None if keys_are_values else nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
            self.k_norm = Gemma4RMSNorm(self.head_dim, config.rms_norm_eps)
            self.v_norm = Gemma4RMSNorm(self.head_dim, config.rms_norm_eps, with_scale=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        source = config.kv_sources[index]
        # a sharing layer reads a source of its own layer type, so its window is the source's
        self.attn = Attention(layer_name(index), self.num_heads, self.num_kv_heads, self.head_dim, kind="self",
                              kv_sharing_target=layer_name(source) if self.kv_shared else None,
                              sliding_window=self.window, sm_scale=1.0)
        self.kv_transform = None                    # set through Gemma4ForCausalLM.kv_transform

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Fresh K (normed, rotated) and V (normed) for the tokens of x: each [B, T, kv_heads, D]."""
        shape = (*x.shape[:-1], self.num_kv_heads, self.head_dim)
        k = linear(x, self.k_proj).view(shape)
        v = k if self.v_proj is None else linear(x, self.v_proj).view(shape)   # k_eq_v: v is the raw key projection
        return self.k_norm(k, cos=cos, sin=sin), self.v_norm(v)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q (normed, rotated) and, in a KV-owning layer, project_kv's k and v (else None), each [B, T, heads, D]. With
        a v_proj, where the kernels run: one matmul and one norm launch for all three."""
        heads = (self.num_heads, self.num_kv_heads, self.num_kv_heads)
        own_v = not self.kv_shared and self.v_proj is not None
        if (qkv := fused_matmul(x, self.q_proj, stack=(self.k_proj, self.v_proj)) if own_v else None) is not None:
            qkv = qkv.view(*x.shape[:-1], sum(heads), self.head_dim)
            return rms_norm(qkv, self.q_norm.weight, self.q_norm.eps, cos=cos, sin=sin,
                            kv=(self.k_norm.weight, self.num_kv_heads), validate=False).split(heads, dim=-2)
        q = self.q_norm(linear(x, self.q_proj).view(*x.shape[:-1], self.num_heads, self.head_dim), cos=cos, sin=sin)
        return (q, None, None) if self.kv_shared else (q, *self.project_kv(x, cos, sin))

    def forward(self, x, cos, sin, positions, produced: dict, cache: DenseKVCache | None, ctx=None):
        q, k, v = self.project(x, cos, sin)
        if ctx is None:
            return self.o_proj(dense_attention(self, q, k, v, positions, produced, cache))
        out = self.attn(q[0], *(t if t is None else t[0] for t in (k, v)), ctx)   # x: [1, T, H]; window, scale 1
        return linear(out.reshape(*x.shape[:-1], -1), self.o_proj)


class Gemma4MLP(nn.Module):
    def __init__(self, config: Gemma4Config, index: int):
        super().__init__()
        wide = 2 if config.use_double_wide_mlp and config.is_kv_shared(index) else 1
        inter = config.intermediate_size * wide
        self.gate_proj = nn.Linear(config.hidden_size, inter, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, inter, bias=False)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=False)
        self.act = _ACTIVATIONS[config.hidden_activation]
        self.fusable = config.hidden_activation == "gelu_pytorch_tanh"     # decode_matmul's GELU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = fused_matmul(x, self.gate_proj, up=self.up_proj) if self.fusable else None
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x) if h is None else h)


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, config: Gemma4Config, index: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = Gemma4Attention(config, index)
        self.mlp = Gemma4MLP(config, index)
        self.input_layernorm = Gemma4RMSNorm(h, eps)
        self.post_attention_layernorm = Gemma4RMSNorm(h, eps)
        self.pre_feedforward_layernorm = Gemma4RMSNorm(h, eps)
        self.post_feedforward_layernorm = Gemma4RMSNorm(h, eps)
        self.register_buffer("layer_scalar", torch.ones(1))
        self.ple_dim = config.hidden_size_per_layer_input
        if self.ple_dim:
            self.act = _ACTIVATIONS[config.hidden_activation]
            self.per_layer_input_gate = nn.Linear(h, self.ple_dim, bias=False)
            self.per_layer_projection = nn.Linear(self.ple_dim, h, bias=False)
            self.post_per_layer_input_norm = Gemma4RMSNorm(h, eps)

    def forward(self, x, normed, per_layer_input, cos, sin, positions, produced, cache, ctx=None, then=None):
        """x: the residual stream, normed: input_layernorm(x). Returns (output, then(output)), `then` being the next
        layer's input norm or the final norm: on a GPU each pair of norms is one launch."""
        attn = self.self_attn(normed, cos, sin, positions, produced, cache, ctx)
        x, h = self.post_attention_layernorm(attn, residual=x, then=self.pre_feedforward_layernorm)
        return self.feed_forward(x, per_layer_input, h, then)

    def feed_forward(self, x, per_layer_input, normed, then):
        """The MLP (on normed = pre_feedforward_layernorm(x)), the per-layer input, the layer scalar (in the last
        norm's launch), and `then` of the output."""
        if not self.ple_dim:
            return self.post_feedforward_layernorm(self.mlp(normed), residual=x, scale=self.layer_scalar, then=then)
        x = self.post_feedforward_layernorm(self.mlp(normed), residual=x)
        gated = fused_matmul(x, self.per_layer_input_gate, times=per_layer_input) if self.mlp.fusable else None
        if gated is None:
            gated = self.act(self.per_layer_input_gate(x)) * per_layer_input
        gated = linear(gated, self.per_layer_projection)
        return self.post_per_layer_input_norm(gated, residual=x, scale=self.layer_scalar, then=then)


class Gemma4TextModel(nn.Module):
    """The decoder stack (transformers' `model.` prefix): embeddings, PLE, layers, final norm."""

    def __init__(self, config: Gemma4Config):
        super().__init__()
        self.config = config
        h, n = config.hidden_size, config.num_hidden_layers
        self.embed_tokens = ScaledEmbedding(config.vocab_size, h, h ** 0.5)
        self.layers = nn.ModuleList(Gemma4DecoderLayer(config, i) for i in range(n))
        self.norm = Gemma4RMSNorm(h, config.rms_norm_eps)
        p = config.hidden_size_per_layer_input
        if p:
            self.embed_tokens_per_layer = ScaledEmbedding(config.vocab_size_per_layer_input, n * p, p ** 0.5)
            self.per_layer_model_projection = nn.Linear(h, n * p, bias=False)
            self.per_layer_projection_norm = Gemma4RMSNorm(p, config.rms_norm_eps)
        self.init_rope_buffers()

    def init_rope_buffers(self) -> None:
        """(Re)compute each layer type's RoPE inverse frequencies in float32."""
        device = self.embed_tokens.weight.device
        for t in sorted(set(self.config.layer_types)):
            inv = rope_inv_freq(self.config.rope_parameters[t], self.config.head_dim_of_type(t))
            self.register_buffer(f"inv_freq_{t}", inv.to(device), persistent=False)

    def per_layer_inputs(self, input_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """[layers, B, T, P], a layer's rows contiguous: (normed projection + per-layer embedding) / sqrt(2)."""
        c, p = self.config, self.config.hidden_size_per_layer_input
        shape = (*input_ids.shape, c.num_hidden_layers, p)
        projected = self.per_layer_model_projection(embeds) * c.hidden_size ** -0.5
        projected = self.per_layer_projection_norm(projected.reshape(shape))
        out = (projected + self.embed_tokens_per_layer(input_ids).reshape(shape)) * 2.0 ** -0.5
        return out.movedim(-2, 0).contiguous()

    def rope(self, layer_type: str, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions[..., None].float() * getattr(self, f"inv_freq_{layer_type}").float()   # float32
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: DenseKVCache | None = None, ctx=None):
        x = self.embed_tokens(input_ids)
        ple = self.per_layer_inputs(input_ids, x) if self.config.hidden_size_per_layer_input else None
        rope = {t: self.rope(t, positions, x.dtype) for t in set(self.config.layer_types)}
        produced: dict = {}
        normed = self.layers[0].input_layernorm(x)
        for i, layer in enumerate(self.layers):
            if ctx is not None and ctx.shared_rows is not None and i == self.config.first_kv_shared_layer:
                # kv_sharing_fast_prefill: no layer from here on writes K/V; only the sampled rows matter
                rows = ctx.shared_rows
                x, normed, positions = x[:, rows], normed[:, rows], positions[:, rows]
                ple = None if ple is None else ple[:, :, rows]
                rope = {t: self.rope(t, positions, x.dtype) for t in rope}
                ctx.attn_metadata, ctx.rows_kept = ctx.shared_metadata, True
            cos, sin = rope[self.config.layer_types[i]]
            then = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            x, normed = layer(x, normed, None if ple is None else ple[i], cos, sin, positions, produced, cache,
                              ctx, then)
        return normed


class Gemma4ForCausalLM(nn.Module):
    """Decoder + LM head (tied to the embedding unless the config unties it) + optional logit soft-capping."""

    def __init__(self, config: Gemma4Config):
        super().__init__()
        self.config = config
        self.model = Gemma4TextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def kv_transform(self):
        """Applied to every fresh K and V in dense mode; None: untouched."""
        return self.model.layers[0].self_attn.kv_transform

    @kv_transform.setter
    def kv_transform(self, fn):
        for layer in self.model.layers:
            layer.self_attn.kv_transform = fn

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None,
                cache: DenseKVCache | None = None, *, ctx=None) -> torch.Tensor:
        """Final-normed hidden states: [B, T] in, [B, T, H] out; engine mode (`ctx`): [T] in, [T, H] out."""
        if ctx is not None:
            check_token_inputs(input_ids, positions, engine=True)
            return self.model(input_ids[None], positions[None], None, ctx)[0]
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
        if positions is None:
            start = cache.length if cache is not None else 0
            positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
            positions = positions.expand_as(input_ids)
        return self.model(input_ids, positions, cache)

    def attention_layers(self) -> list[Attention]:
        """The attention ops, in model order: the engine binds an impl and a cache to each op's layer name."""
        return [layer.self_attn.attn for layer in self.model.layers]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    def logits(self, input_ids: torch.Tensor, cache: DenseKVCache | None = None) -> torch.Tensor:
        return self.compute_logits(self(input_ids, cache=cache))

    @torch.no_grad()
    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Prefill, then one token at a time through a DenseKVCache; returns the new token ids [B, N]."""
        cache, out = DenseKVCache(), []
        logits = self.logits(input_ids, cache)[:, -1]
        for _ in range(max_new_tokens):
            out.append(logits.argmax(-1, keepdim=True))
            logits = self.logits(out[-1], cache)[:, -1]
        return torch.cat(out, dim=1)
