"""Which tiny models exist, their configs and tokenizer, and loading their shipped weights.

The weights live inside the package (minikv/models/weights/NAME.safetensors, stored as float16) with a JSON file
beside them that records the config and how the weights were trained. A SHA-256 of the tensor bytes is kept in
the safetensors header, so a file whose header still parses but whose data was damaged is refused too.

    model = load_model("tiny-kvshare")                 # float32 on CPU, bfloat16 on CUDA
    model = load_model("tiny-encdec", device="cuda")   # float16 on CPU and on CUDA
    model = load_model("/path/to/dir")                  # a transformers-format Gemma-4 or T5 checkpoint directory

tiny-gemma4 and tiny-t5 are shipped as checkpoint directories in transformers' format
(minikv/models/weights/NAME/: config.json, model.safetensors, minikv_tokenizer.json and training.json, the
recipe and metrics of the run that produced them); `CHECKPOINT_CONFIGS` holds the config.json they are trained
from.

`load_model` and `get_tokenizer` also take the path of a checkpoint directory in transformers' format
(config.json + model.safetensors; see `minikv.models.hf_checkpoint` and `minikv.models.dir_tokenizer`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from minikv.config import ModelConfig
from minikv.models import hf_checkpoint
from minikv.models.dir_tokenizer import load_tokenizer
from minikv.models.encdec import EncDecModel
from minikv.models.gemma4 import FULL, SLIDING, Gemma4Config, Gemma4ForCausalLM
from minikv.models.kvshare import KVShareModel
from minikv.models.t5 import T5Config, T5ForConditionalGeneration
from minikv.models.tokenizer import CharTokenizer

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
STORAGE_DTYPE = torch.float16
_VOCAB = CharTokenizer().vocab_size

_CONFIGS = {
    "tiny-kvshare": ModelConfig(
        name="tiny-kvshare", vocab_size=_VOCAB, hidden_size=128, num_layers=6, num_heads=4, num_kv_heads=2,
        head_size=32, intermediate_size=256, max_position=128, kv_sharing={4: 2, 5: 3},
    ),
    "tiny-encdec": ModelConfig(
        name="tiny-encdec", vocab_size=_VOCAB, hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        head_size=32, intermediate_size=256, max_position=64, is_encoder_decoder=True, num_encoder_layers=2,
        max_encoder_len=64,
    ),
}

# The trained Gemma-4 and T5 checkpoints: their config.json (transformers' keys) and tokenizer alphabet.
# tiny-gemma4: sliding and full layers; the last 4 layers share K/V, two sharers per source cache (layers 4 and 6
# read layer 2's sliding cache, 5 and 7 read layer 3's full cache). The sliding window (32 positions) is shorter
# than most prompts of the task (up to 96 tokens with BOS, plus 12 new ones), so sliding layers really slide; the
# task needs only the last two terms, and the full layers see everything.
_DIGITS = " 0123456789"
_REVERSE_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
CHECKPOINT_ALPHABETS = {"tiny-gemma4": _DIGITS, "tiny-t5": _REVERSE_ALPHABET}
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
MODEL_NAMES: tuple[str, ...] = tuple(_CONFIGS) + tuple(CHECKPOINT_CONFIGS)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelLoadError(RuntimeError):
    """A model could not be loaded: unknown name, or a missing, truncated, corrupted or mismatched weights file."""


def _check_name(name: str) -> None:
    if name not in MODEL_NAMES:
        raise ModelLoadError(f"unknown model {name!r}; known models: {', '.join(MODEL_NAMES)}")


def is_checkpoint_model(name) -> bool:
    """True for the models shipped as transformers-format directories (tiny-gemma4, tiny-t5)."""
    return isinstance(name, str) and name in CHECKPOINT_CONFIGS


def model_config(name: str) -> ModelConfig | Gemma4Config | T5Config:
    _check_name(name)
    if name == "tiny-gemma4":
        return Gemma4Config.from_hf_dict(CHECKPOINT_CONFIGS[name], name=name)
    if name == "tiny-t5":
        return T5Config.from_hf_dict(CHECKPOINT_CONFIGS[name], tie_lm_head=False, name=name)
    return _CONFIGS[name]


def get_tokenizer(name: str | Path) -> CharTokenizer:
    if is_checkpoint_model(name):
        return CharTokenizer(CHECKPOINT_ALPHABETS[name])
    if hf_checkpoint.is_checkpoint_dir(name):
        return load_tokenizer(name)
    _check_name(name)
    return CharTokenizer()


def build_model(name: str) -> nn.Module:
    """A freshly initialized float32 model (random weights: seed torch first)."""
    config = model_config(name)
    if isinstance(config, Gemma4Config):
        return Gemma4ForCausalLM(config)
    if isinstance(config, T5Config):
        return T5ForConditionalGeneration(config)
    return EncDecModel(config) if config.is_encoder_decoder else KVShareModel(config)


def default_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """tiny-encdec always runs in float16; the others in float32 on CPU and bfloat16 on CUDA."""
    _check_name(name)
    if name == "tiny-encdec":
        return torch.float16
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def checkpoint_dir(name: str, weights_dir: str | Path | None = None) -> Path:
    """The directory of a checkpoint model (tiny-gemma4, tiny-t5)."""
    return Path(weights_dir or WEIGHTS_DIR) / name


def weights_path(name: str, weights_dir: str | Path | None = None) -> Path:
    if is_checkpoint_model(name):
        return checkpoint_dir(name, weights_dir) / hf_checkpoint.WEIGHTS_FILE
    return Path(weights_dir or WEIGHTS_DIR) / f"{name}.safetensors"


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_weights(model: nn.Module, weights_dir: str | Path | None = None, info: dict | None = None) -> Path:
    """Write NAME.safetensors (float16) and NAME.json (config + `info`) into `weights_dir`."""
    name = model.config.name
    path = weights_path(name, weights_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", STORAGE_DTYPE).contiguous() for k, v in model.state_dict().items()}
    # One metadata key only: safetensors writes several in no fixed order, and the file should be reproducible.
    save_file(tensors, str(path), metadata={"tensors_sha256": tensors_digest(tensors)})
    record = {"config": asdict(model.config), **(info or {})}
    path.with_suffix(".json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    for written in (path, path.with_suffix(".json")):
        written.chmod(0o644)                            # save_file creates owner-only files
    return path


def _read_weights(name: str, path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelLoadError(f"weights file for {name!r} is missing: {path}. Rebuild it with `minikv train {name}`.")
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as f:                     # the header: 8-byte length, then JSON
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    except (SafetensorError, OSError, ValueError, RuntimeError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"weights file for {name!r} is truncated or corrupted ({path}): {err}") from None
    recorded = header.get("__metadata__", {}).get("tensors_sha256")
    if recorded != tensors_digest(tensors):
        raise ModelLoadError(f"weights file for {name!r} is corrupted ({path}): its tensor bytes do not match "
                             f"the SHA-256 recorded when it was saved")
    return tensors


def _check_tensors(name: str, model: nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> None:
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    problems = [f"missing {k}" for k in sorted(wanted.keys() - got.keys())]
    problems += [f"unexpected {k}" for k in sorted(got.keys() - wanted.keys())]
    problems += [f"{k} has shape {got[k]}, config wants {wanted[k]}"
                 for k in sorted(wanted.keys() & got.keys()) if got[k] != wanted[k]]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ModelLoadError(f"weights file for {name!r} does not match its config ({path}): {shown}")


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
    if hf_checkpoint.is_checkpoint_dir(name):
        try:
            return hf_checkpoint.load_checkpoint(name, device=device, dtype=dtype)
        except hf_checkpoint.CheckpointError as err:
            raise ModelLoadError(str(err)) from None
    _check_name(name)
    if dtype is None:
        dtype = default_dtype(name, device)
    if dtype not in _DTYPES.values():
        raise ValueError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype}")
    path = weights_path(name, weights_dir)
    tensors = _read_weights(name, path)
    model = build_model(name)
    _check_tensors(name, model, tensors, path)
    model.load_state_dict({k: v.float() for k, v in tensors.items()})
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)
