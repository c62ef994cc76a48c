"""Which models minikv ships, their configs and tokenizers, and loading their weights.
See docs/internals.md#models-registry."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from minikv.kernels.errors import BadInputError, InvalidTypeError, InvalidValueError
from minikv.models import hf_checkpoint
from minikv.models.dir_tokenizer import TokenizerFileError, load_tokenizer
from minikv.models.gemma4 import FULL, SLIDING, Gemma4Config, Gemma4ForCausalLM
from minikv.models.t5 import T5Config, T5ForConditionalGeneration
from minikv.models.tokenizer import CharTokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
STORAGE_DTYPE = torch.float16
# The trained Gemma-4 and T5 checkpoints: their config.json (transformers' keys) and tokenizer alphabet.
# tiny-gemma4: sliding and full layers; the last 4 layers share K/V, two sharers per source cache (layers 4 and 6
# read layer 2's sliding cache, 5 and 7 read layer 3's full cache). The sliding window (32 positions) is shorter
# than most prompts of the task (up to 96 tokens with BOS, plus 12 new ones), so sliding layers really slide; the
# task needs only the last two terms, and the full layers see everything.
_DIGITS = " 0123456789"
_REVERSE_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
CHECKPOINT_ALPHABETS = {"tiny-gemma4": _DIGITS, "tiny-t5": _REVERSE_ALPHABET, "tiny-gemma4-e2b": _DIGITS}
# tiny-gemma4-e2b: gemma-4-E2B's published text config (google/gemma-4-E2B-it, config.json `text_config`, as
# transformers' Gemma4TextConfig reads it) with only the widths shrunk: hidden size 1,536 -> 32, intermediate size
# 6,144 -> 128 (the same 4x; double-wide on the 20 KV-sharing layers, as E2B's use_double_wide_mlp makes it),
# vocabulary 262,144 -> the 14 ids of tiny-gemma4's character tokenizer (for the per-layer embeddings too), and the
# context length 131,072 -> 128 positions (it sizes the KV pools). Everything that decides the topology is E2B's:
# 35 layers of 4 sliding : 1 full, the last 20 sharing KV (so layers 15-34 read layer 13's sliding cache or layer
# 14's full cache), sliding window 512, 8 query heads over 1 KV head, head size 256 on sliding and 512 on full
# layers, proportional RoPE on full layers (25% of the pairs rotate, theta 1e6), per-layer inputs of width 256,
# final logit soft-capping at 30. Its weights are random (`minikv.models.random_weights`): the census does not
# depend on them.
_E2B_LAYER_TYPES = ([SLIDING] * 4 + [FULL]) * 7
# gemma-4-E2B's own values of the keys tiny-gemma4-e2b shrinks (every other key of its text config is E2B's).
E2B_SHRUNK = {"hidden_size": 1536, "intermediate_size": 6144, "vocab_size": 262_144,
              "vocab_size_per_layer_input": 262_144, "max_position_embeddings": 131_072}
RANDOM_WEIGHT_MODELS = ("tiny-gemma4-e2b",)
CHECKPOINT_CONFIGS = {
    "tiny-gemma4": {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "vocab_size": CharTokenizer(_DIGITS).vocab_size, "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "global_head_dim": 32, "layer_types": [SLIDING, FULL, SLIDING, FULL, SLIDING, FULL, SLIDING, FULL],
        "sliding_window": 32, "max_position_embeddings": 128, "num_kv_shared_layers": 4,
        "hidden_size_per_layer_input": 16, "vocab_size_per_layer_input": CharTokenizer(_DIGITS).vocab_size,
        "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "attention_k_eq_v": False, "use_double_wide_mlp": False, "enable_moe_block": False,
    },
    "tiny-t5": {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "is_encoder_decoder": True,
        "vocab_size": CharTokenizer(_REVERSE_ALPHABET).vocab_size, "d_model": 128, "d_kv": 32, "d_ff": 256,
        "num_layers": 3, "num_decoder_layers": 3, "num_heads": 4, "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 64, "layer_norm_epsilon": 1e-6, "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False, "pad_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 1,
        "dropout_rate": 0.0,
    },
}
CHECKPOINT_CONFIGS["tiny-gemma4-e2b"] = {
    "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
    "vocab_size": CharTokenizer(_DIGITS).vocab_size, "hidden_size": 32, "intermediate_size": 128,
    "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": None, "attention_k_eq_v": False,
    "layer_types": _E2B_LAYER_TYPES, "sliding_window": 512, "num_kv_shared_layers": 20,
    "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": CharTokenizer(_DIGITS).vocab_size,
    "use_double_wide_mlp": True, "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
    "rope_parameters": {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0}},
    "tie_word_embeddings": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "enable_moe_block": False, "attention_bias": False, "use_bidirectional_attention": None,
}
MODEL_NAMES: tuple[str, ...] = tuple(CHECKPOINT_CONFIGS)
TRAINED_MODELS: tuple[str, ...] = tuple(n for n in MODEL_NAMES if n not in RANDOM_WEIGHT_MODELS)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelLoadError(BadInputError, RuntimeError):
    """A model could not be loaded: unknown name, or a missing, truncated, corrupted or mismatched weights file."""


TOKENIZER_HINT = ("a checkpoint directory carries the tokenizer its model was trained with: "
                  "tokenizer.save_pretrained(DIR) writes tokenizer.json beside config.json")


def _check_name(name: str) -> None:
    if name not in MODEL_NAMES:
        raise ModelLoadError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")


def is_checkpoint_model(name) -> bool:
    """True for the models shipped as transformers-format directories (`MODEL_NAMES`)."""
    return isinstance(name, str) and name in CHECKPOINT_CONFIGS


def check_model(model) -> str:
    """`model` as a str: a shipped model's name or a local checkpoint directory; else raises."""
    if isinstance(model, str) and not model.strip():
        raise InvalidValueError(f"model must be a shipped model ({', '.join(MODEL_NAMES)}) or the path of a "
                                f"checkpoint directory, got {model!r} (an empty path would load the working "
                                f"directory)")
    if isinstance(model, os.PathLike) or (isinstance(model, str) and model not in MODEL_NAMES
                                          and ("/" in model or os.sep in model or Path(model).is_dir())):
        path = Path(model)
        if not path.is_dir():
            raise InvalidValueError(f"model {str(model)!r} is neither a shipped model ({', '.join(MODEL_NAMES)}) "
                                    f"nor an existing checkpoint directory")
        if not hf_checkpoint.is_checkpoint_dir(path):
            raise InvalidValueError(f"{str(path)!r} is not a checkpoint directory: it has no config.json (expected "
                                    f"transformers' config.json + model.safetensors of a Gemma-4 or T5 model)")
        return str(path)
    if not isinstance(model, str):
        raise InvalidTypeError(f"model must be a str, one of {', '.join(MODEL_NAMES)}, or a checkpoint directory's "
                               f"path; got {type(model).__name__} {model!r}")
    if model not in MODEL_NAMES:
        raise InvalidValueError(f"unknown model {model!r}; choose one of {', '.join(MODEL_NAMES)}")
    return model


def model_config(name: str) -> Gemma4Config | T5Config:
    _check_name(name)
    if name == "tiny-t5":
        return T5Config.from_hf_dict(CHECKPOINT_CONFIGS[name], tie_lm_head=False, name=name)
    return Gemma4Config.from_hf_dict(CHECKPOINT_CONFIGS[name], name=name)


def get_tokenizer(name: str | Path) -> CharTokenizer:
    """The tokenizer of a shipped model, or of a checkpoint directory (ModelLoadError naming the file when it
    is missing, unreadable, or has more ids than the model's vocabulary)."""
    if is_checkpoint_model(name):
        return CharTokenizer(CHECKPOINT_ALPHABETS[name])
    if not hf_checkpoint.is_checkpoint_dir(name):
        _check_name(name)            # neither a shipped name nor a checkpoint directory: say which names exist
    try:
        hf_checkpoint.read_config(name)      # the config first: its errors are not the tokenizer's
    except hf_checkpoint.CheckpointError as err:
        raise ModelLoadError(str(err), hint=err.hint) from None
    try:
        return load_tokenizer(name)
    except TokenizerFileError as err:
        raise ModelLoadError(str(err), hint=TOKENIZER_HINT) from None


def build_model(name: str) -> nn.Module:
    """A freshly initialized float32 model (random weights: seed torch first)."""
    config = model_config(name)
    if isinstance(config, Gemma4Config):
        return Gemma4ForCausalLM(config)
    return T5ForConditionalGeneration(config)


def default_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """float32 on CPU (the Triton interpreter has no bfloat16), bfloat16 on CUDA."""
    _check_name(name)
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def checkpoint_dir(name: str, weights_dir: str | Path | None = None) -> Path:
    """The directory of a shipped checkpoint model (`MODEL_NAMES`)."""
    return Path(weights_dir or WEIGHTS_DIR) / name


def weights_path(name: str, weights_dir: str | Path | None = None) -> Path:
    """The safetensors file of a shipped model."""
    _check_name(name)
    return checkpoint_dir(name, weights_dir) / hf_checkpoint.WEIGHTS_FILE


def check_loadable(model) -> str:
    """`model` checked as far as it can be without loading weights (check_model, then for a checkpoint directory
    config.json, each weights file's header and the tokenizer); returned as `check_model` returns it. Commands call
    it before their first progress bar, so a bad model is one error line, not an error after a 0% bar."""
    model = check_model(model)
    if not is_checkpoint_model(model):
        try:
            hf_checkpoint.check_weight_headers(model)
        except hf_checkpoint.CheckpointError as err:
            raise ModelLoadError(str(err), hint=err.hint) from None
    get_tokenizer(model)
    return model


def load_model(name: str, device: str | torch.device = "cpu", dtype: torch.dtype | str | None = None,
               weights_dir: str | Path | None = None) -> nn.Module:
    """The model with its shipped weights, in eval mode, on `device`, in `dtype` (None: `default_dtype`).
    `name` may also be a checkpoint directory in transformers' format."""
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
        dtype = _DTYPES[dtype]
    if is_checkpoint_model(name):
        path = checkpoint_dir(name, weights_dir)
        if not hf_checkpoint.is_checkpoint_dir(path):
            raise ModelLoadError(f"checkpoint directory for {name!r} is missing: {path}. Rebuild it with "
                                 f"`minikv train {name}`.")
        name, dtype = path, default_dtype(name, device) if dtype is None else dtype
    if not hf_checkpoint.is_checkpoint_dir(name):
        _check_name(name)            # neither a shipped name nor a checkpoint directory: say which names exist
    try:
        return hf_checkpoint.load_checkpoint(name, device=device, dtype=dtype)
    except hf_checkpoint.CheckpointError as err:
        raise ModelLoadError(str(err), hint=err.hint) from None
