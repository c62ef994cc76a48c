"""Gemma-4's text configuration: transformers' `gemma4_text` config.json read into one checked dataclass.
See docs/internals.md#models-gemma4-config."""
from __future__ import annotations

from dataclasses import dataclass, field

from minikv.kernels.errors import BadInputError

SLIDING, FULL = "sliding_attention", "full_attention"
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu", "silu", "relu")     # hidden_activation: what gemma4.py implements
_DEFAULT_ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}


class Gemma4ConfigError(BadInputError, ValueError):
    """A gemma4_text config that minikv cannot run (unsupported option or inconsistent values)."""


@dataclass(frozen=True)
class Gemma4Config:
    """The resolved shape of a Gemma-4 text decoder: every per-layer value already derived."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_types: tuple[str, ...]
    layer_head_dims: tuple[int, ...]         # head size of each layer
    layer_kv_heads: tuple[int, ...]          # KV heads of each layer
    sliding_window: int
    rope_parameters: dict = field(default_factory=lambda: dict(_DEFAULT_ROPE))
    hidden_activation: str = "gelu_pytorch_tanh"
    rms_norm_eps: float = 1e-6
    final_logit_softcapping: float | None = None
    hidden_size_per_layer_input: int = 0
    vocab_size_per_layer_input: int = 0
    attention_k_eq_v: bool = False
    num_kv_shared_layers: int = 0
    use_double_wide_mlp: bool = False
    attention_bias: bool = False
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 131_072
    pad_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    bos_token_id: int | None = 2
    name: str = field(default="gemma4", compare=False)

    def __post_init__(self):
        n = self.num_hidden_layers
        for key in ("layer_types", "layer_head_dims", "layer_kv_heads"):
            if len(getattr(self, key)) != n:
                raise Gemma4ConfigError(f"{key} has {len(getattr(self, key))} entries for {n} layers")
        if bad := set(self.layer_types) - {SLIDING, FULL}:
            raise Gemma4ConfigError(f"unknown layer types {sorted(bad)}; Gemma-4 has {SLIDING!r} and {FULL!r}")
        for t in set(self.layer_types):
            rope = self.rope_parameters.get(t)
            if rope is None or rope.get("rope_type", "default") not in ("default", "proportional"):
                raise Gemma4ConfigError(f"rope_parameters[{t!r}] must be a 'default' or 'proportional' RoPE, "
                                        f"got {rope!r}")
            dims = {d for d, lt in zip(self.layer_head_dims, self.layer_types) if lt == t}
            if len(dims) != 1:
                raise Gemma4ConfigError(f"all {t} layers must share one head size (RoPE is per type), got {dims}")
        for i, kv in enumerate(self.layer_kv_heads):
            if self.num_attention_heads % kv:
                raise Gemma4ConfigError(f"layer {i}: {self.num_attention_heads} query heads are not a multiple "
                                        f"of {kv} KV heads")
        if not 0 <= self.num_kv_shared_layers < n:
            raise Gemma4ConfigError(f"num_kv_shared_layers must be in [0, {n}), got {self.num_kv_shared_layers}")
        if self.hidden_activation not in ACTIVATIONS:
            raise Gemma4ConfigError(f"hidden_activation {self.hidden_activation!r} is not supported; choose one "
                                    f"of {', '.join(ACTIVATIONS)}")
        self.kv_sources  # noqa: B018  (validates the sharing topology)

    # ---- derived topology -------------------------------------------------------------------------------------
    @property
    def first_kv_shared_layer(self) -> int:
        return self.num_hidden_layers - self.num_kv_shared_layers

    @property
    def kv_sources(self) -> tuple[int, ...]:
        """For each layer, the layer whose K/V it attends over: itself, or for a sharing layer the last layer
        before the shared block with the same layer type (transformers' `kv_sharing_modes`)."""
        first = self.first_kv_shared_layer
        last_of_type = {t: i for i, t in enumerate(self.layer_types[:first])}
        if set(last_of_type) != set(self.layer_types):
            raise Gemma4ConfigError("every layer type used by a KV-sharing layer needs a non-shared layer of the "
                                    f"same type before layer {first} to produce its cache; layer types "
                                    f"{list(self.layer_types)}, num_kv_shared_layers={self.num_kv_shared_layers}")
        return tuple(i if i < first else last_of_type[t] for i, t in enumerate(self.layer_types))

    def is_kv_shared(self, layer: int) -> bool:
        return layer >= self.first_kv_shared_layer

    def window(self, layer: int) -> int | None:
        """Keys a query of `layer` may see, itself included (None: all earlier positions)."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def head_dim_of_type(self, layer_type: str) -> int:
        return self.layer_head_dims[self.layer_types.index(layer_type)]

    # ---- what minikv's engine reads (the same names for every model) --------------------------------------------------
    is_encoder_decoder = False
    max_encoder_len = 0

    @property
    def max_position(self) -> int:
        return self.max_position_embeddings

    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.num_attention_heads

    @property
    def kv_sharing(self) -> dict[int, int]:
        """{sharing layer: the layer whose cache it reads}, the engine's form of `kv_sources`."""
        return {i: s for i, s in enumerate(self.kv_sources) if s != i}

    def kv_owner(self, layer: int) -> int:
        return self.kv_sources[layer]

    @property
    def head_size(self) -> int:
        """The head size of every layer; a config whose layers differ has none (read `layer_head_dims`)."""
        return self._uniform("layer_head_dims", "head sizes")

    @property
    def num_kv_heads(self) -> int:
        """The KV-head count of every layer; a config whose layers differ has none (read `layer_kv_heads`)."""
        return self._uniform("layer_kv_heads", "KV-head counts")

    def _uniform(self, key: str, what: str) -> int:
        values = set(getattr(self, key))
        if len(values) > 1:
            raise Gemma4ConfigError(f"{self.name}: its layers have different {what} {sorted(values)}; read "
                                    f"config.{key} (one entry per layer)")
        return values.pop()

    # ---- transformers' config.json ----------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict, name: str = "gemma4") -> Gemma4Config:
        """Resolve a `gemma4_text` config.json the way transformers' `Gemma4TextConfig` does."""
        if d.get("model_type", "gemma4_text") != "gemma4_text":
            raise Gemma4ConfigError(f"expected model_type 'gemma4_text', got {d.get('model_type')!r}")
        if d.get("enable_moe_block"):
            raise Gemma4ConfigError("Gemma-4 MoE blocks (enable_moe_block=true) are not implemented in minikv")
        if d.get("use_bidirectional_attention") == "all":
            raise Gemma4ConfigError("use_bidirectional_attention='all' is not supported: minikv runs causal "
                                    "decoders")
        n = d.get("num_hidden_layers", 30)
        layer_types = list(d.get("layer_types") or
                           [SLIDING if (i + 1) % 6 else FULL for i in range(n)])
        layer_types[-1] = FULL                              # transformers forces the last layer to be full
        head_dim, kv_heads = d.get("head_dim", 256), d.get("num_key_value_heads", 4)
        k_eq_v = bool(d.get("attention_k_eq_v", False))
        if "per_layer_config" in d:
            overrides = {int(k): dict(v) for k, v in (d["per_layer_config"] or {}).items()}
        else:
            full = {"head_dim": d.get("global_head_dim", 512)}
            if k_eq_v and d.get("num_global_key_value_heads") is not None:
                full["num_key_value_heads"] = d["num_global_key_value_heads"]
            overrides = {i: full for i, t in enumerate(layer_types) if t == FULL}
        for i, o in overrides.items():
            if set(o) - {"head_dim", "num_key_value_heads"}:
                raise Gemma4ConfigError(f"per_layer_config[{i}] overrides {sorted(o)}; minikv supports only "
                                        f"head_dim and num_key_value_heads")
        return cls(
            vocab_size=d.get("vocab_size", 262_144), hidden_size=d.get("hidden_size", 2304),
            intermediate_size=d.get("intermediate_size", 9216), num_hidden_layers=n,
            num_attention_heads=d.get("num_attention_heads", 8), layer_types=tuple(layer_types),
            layer_head_dims=tuple(overrides.get(i, {}).get("head_dim", head_dim) for i in range(n)),
            layer_kv_heads=tuple(overrides.get(i, {}).get("num_key_value_heads", kv_heads) for i in range(n)),
            sliding_window=d.get("sliding_window", 512),
            rope_parameters={k: dict(v) for k, v in (d.get("rope_parameters") or _DEFAULT_ROPE).items()},
            hidden_activation=d.get("hidden_activation", "gelu_pytorch_tanh"),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6), final_logit_softcapping=d.get("final_logit_softcapping"),
            hidden_size_per_layer_input=d.get("hidden_size_per_layer_input", 256) or 0,
            vocab_size_per_layer_input=d.get("vocab_size_per_layer_input", 262_144), attention_k_eq_v=k_eq_v,
            num_kv_shared_layers=d.get("num_kv_shared_layers", 0),
            use_double_wide_mlp=bool(d.get("use_double_wide_mlp", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            tie_word_embeddings=d.get("tie_word_embeddings", True) is not False,
            max_position_embeddings=d.get("max_position_embeddings", 131_072),
            pad_token_id=d.get("pad_token_id", 0), eos_token_id=d.get("eos_token_id", 1),
            bos_token_id=d.get("bos_token_id", 2), name=name,
        )

    def to_hf_dict(self) -> dict:
        """A config.json that transformers resolves back to this config."""
        sliding_dims = {d for d, t in zip(self.layer_head_dims, self.layer_types) if t == SLIDING}
        base_dim = sliding_dims.pop() if sliding_dims else self.layer_head_dims[0]
        base_kv = next((kv for kv, t in zip(self.layer_kv_heads, self.layer_types) if t == SLIDING),
                       self.layer_kv_heads[0])
        per_layer = {str(i): {k: v for k, v in (("head_dim", d), ("num_key_value_heads", kv))
                              if v != {"head_dim": base_dim, "num_key_value_heads": base_kv}[k]}
                     for i, (d, kv) in enumerate(zip(self.layer_head_dims, self.layer_kv_heads))}
        return {
            "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads, "num_key_value_heads": base_kv,
            "head_dim": base_dim, "per_layer_config": {k: v for k, v in per_layer.items() if v},
            "layer_types": list(self.layer_types), "sliding_window": self.sliding_window,
            "rope_parameters": self.rope_parameters, "hidden_activation": self.hidden_activation,
            "rms_norm_eps": self.rms_norm_eps, "final_logit_softcapping": self.final_logit_softcapping,
            "hidden_size_per_layer_input": self.hidden_size_per_layer_input,
            "vocab_size_per_layer_input": self.vocab_size_per_layer_input,
            "attention_k_eq_v": self.attention_k_eq_v, "num_kv_shared_layers": self.num_kv_shared_layers,
            "use_double_wide_mlp": self.use_double_wide_mlp, "attention_bias": self.attention_bias,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings, "pad_token_id": self.pad_token_id,
            "eos_token_id": self.eos_token_id, "bos_token_id": self.bos_token_id, "enable_moe_block": False,
        }
