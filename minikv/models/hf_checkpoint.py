"""Checkpoint directories in transformers' format: `config.json` + `model.safetensors` (or sharded, with
`model.safetensors.index.json`), read into minikv's Gemma-4 and T5 modules and written back.
See docs/internals.md#models-hf-checkpoint."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from minikv.kernels.errors import BadInputError
from minikv.models.gemma4 import Gemma4Config, Gemma4ConfigError, Gemma4ForCausalLM
from minikv.models.t5 import T5Config, T5ConfigError, T5ForConditionalGeneration

CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE = "config.json", "model.safetensors", "model.safetensors.index.json"
# A safetensors header only describes the data; minikv also records a digest of each weights file's tensors in a
# file beside it, so a file whose header still parses but whose data was damaged is refused (weights files the
# digest file does not list, e.g. a downloaded checkpoint's, are not checked). Not in the safetensors metadata:
# safetensors writes metadata keys in no fixed order, and a retrained checkpoint must be identical byte for byte.
DIGEST_FILE = "minikv_sha256.json"
ARCHITECTURES = ("gemma4_text", "gemma4", "t5")
UNSUPPORTED_HINT = ("minikv implements each architecture itself (minikv/models/gemma4.py, minikv/models/t5.py); "
                    "another one needs its own module there")
DAMAGED_HINT = "the file is incomplete or damaged: copy it again, or write it again with save_pretrained"


class CheckpointError(BadInputError, RuntimeError):
    """A checkpoint directory minikv cannot load: missing files, an unsupported architecture, or weights that do
    not match the config."""


def is_checkpoint_dir(path) -> bool:
    """True when `path` (a non-empty str or a Path) is a directory holding a config.json."""
    if isinstance(path, str) and not path.strip():
        return False                    # "" would otherwise name the working directory
    return isinstance(path, (str, Path)) and (Path(path) / CONFIG_FILE).is_file()


def read_json(file: Path, what: str) -> dict:
    """A JSON object from `file`, or CheckpointError naming the file and what is wrong with it."""
    try:
        data = json.loads(file.read_text())
    except OSError as err:
        raise CheckpointError(f"cannot read {file} ({what}): {err}") from None
    except ValueError as err:
        raise CheckpointError(f"{file} ({what}) is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} ({what}) must hold a JSON object, got a {type(data).__name__}")
    return data


# The sizes a config.json must give as integers (absent keys take transformers' defaults); per model type:
# (key, least allowed value).
_SIZES = {
    "gemma4_text": [("vocab_size", 1), ("hidden_size", 1), ("intermediate_size", 1), ("num_hidden_layers", 1),
                    ("num_attention_heads", 1), ("num_key_value_heads", 1), ("head_dim", 1), ("global_head_dim", 1),
                    ("num_global_key_value_heads", 1), ("sliding_window", 1), ("max_position_embeddings", 2),
                    ("hidden_size_per_layer_input", 0), ("vocab_size_per_layer_input", 1),
                    ("num_kv_shared_layers", 0)],
    "t5": [("vocab_size", 1), ("d_model", 1), ("d_kv", 1), ("d_ff", 1), ("num_layers", 1),
           ("num_decoder_layers", 1), ("num_heads", 1), ("relative_attention_num_buckets", 1),
           ("relative_attention_max_distance", 1)],
}
_POSITIVE_FLOATS = {"gemma4_text": ("rms_norm_eps", "final_logit_softcapping"), "t5": ("layer_norm_epsilon",)}
_OPTIONAL = {"num_global_key_value_heads", "final_logit_softcapping", "num_decoder_layers"}   # null allowed


def check_config(config: dict, file: Path) -> None:
    """Refuse sizes that are not integers of the allowed range (strings, floats, booleans, zero), naming the file
    and the key; `model_type` "gemma4" is checked through its `text_config`."""
    model_type = config.get("model_type")
    if model_type == "gemma4":
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise CheckpointError(f"{file}: a model_type 'gemma4' config needs a `text_config` object, got "
                                  f"{type(text).__name__}")
        config, model_type, where = text, "gemma4_text", "text_config."
    else:
        where = ""
    for key, low in _SIZES.get(model_type, []):
        value = config.get(key)
        if key not in config or (value is None and key in _OPTIONAL):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            need = "a positive integer" if low == 1 else f"an integer of at least {low}"
            raise CheckpointError(f"{file}: {where}{key} must be {need}, got {value!r}")
    for key in _POSITIVE_FLOATS.get(model_type, ()):
        value = config.get(key)
        if key not in config or (value is None and key in _OPTIONAL):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise CheckpointError(f"{file}: {where}{key} must be a positive number, got {value!r}")
    for key in ("layer_types", "per_layer_config", "rope_parameters"):
        value = config.get(key)
        kind = list if key == "layer_types" else dict
        if value is not None and not isinstance(value, kind):
            raise CheckpointError(f"{file}: {where}{key} must be a JSON {'array' if kind is list else 'object'}, "
                                  f"got {type(value).__name__}")
    for layer, override in (config.get("per_layer_config") or {}).items():
        if not (isinstance(layer, str) and layer.isdigit()) or not isinstance(override, dict):
            raise CheckpointError(f"{file}: {where}per_layer_config maps layer indices to objects, got "
                                  f"{layer!r}: {override!r}")
        for key, value in override.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CheckpointError(f"{file}: {where}per_layer_config[{layer}].{key} must be a positive "
                                      f"integer, got {value!r}")


def read_config(path: str | Path) -> dict:
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise CheckpointError(f"{path} is not a checkpoint directory: it has no {CONFIG_FILE}")
    config = read_json(file, "the model's config")
    model_type = config.get("model_type")
    if model_type not in ARCHITECTURES:          # before any weights are read: a real checkpoint is gigabytes
        raise CheckpointError(f"{file}: model_type {model_type!r} is not supported; minikv runs Gemma-4 "
                              f"(gemma4_text, gemma4) and T5 (t5) checkpoints", hint=UNSUPPORTED_HINT)
    check_config(config, file)
    return config


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a directory: model.safetensors, or every shard its index names (all present)."""
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    if not (path / INDEX_FILE).is_file():
        raise CheckpointError(f"{path} has neither {WEIGHTS_FILE} nor {INDEX_FILE}")
    index_file = path / INDEX_FILE
    weight_map = read_json(index_file, "the index of the weight shards").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointError(f"{index_file}: expected a non-empty `weight_map` object mapping tensor names to "
                              f"shard file names, got {weight_map!r:.200}")
    files = [path / name for name in sorted(set(weight_map.values()))]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{index_file} names shard(s) that are not in {path}: {', '.join(missing)}")
    return files


def read_digests(path: Path) -> dict[str, str]:
    """{weights file name: SHA-256 of its tensors} from minikv_sha256.json ({} when the directory has none)."""
    file = path / DIGEST_FILE
    if not file.exists():
        return {}
    digests = read_json(file, "the SHA-256 of the weights")
    if not all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in digests.items()):
        raise CheckpointError(f"{file}: expected {{\"weights file name\": \"64 hex digits\"}}, got "
                              f"{json.dumps(digests)[:200]}")
    return digests


def check_weight_headers(path: str | Path) -> None:
    """Read config.json and every weights file's header, without the tensor data: a missing, truncated or
    malformed file fails here, in a moment, before a command draws a progress bar or loads gigabytes."""
    path = Path(path)
    read_config(path)
    for file in weight_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                f.keys()
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"cannot read {file}: {err}", hint=DAMAGED_HINT) from None


def read_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory: one model.safetensors, or the shards its index names."""
    path = Path(path)
    files = weight_files(path)
    digests = read_digests(path)
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        expected = digests.get(file.name)
        try:
            loaded = load_file(str(file))
        except (SafetensorError, OSError, RuntimeError) as err:
            raise CheckpointError(f"cannot read {file}: {err}", hint=DAMAGED_HINT) from None
        if expected is not None and tensor_digest(loaded) != expected:
            raise CheckpointError(f"{file}: the tensor data does not match the SHA-256 recorded when it was saved "
                                  f"(the file is damaged); restore it, or rebuild it with `minikv train`")
        tensors.update(loaded)
    return tensors


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _lm_head_is_tied(tensors: dict[str, torch.Tensor], embedding_key: str) -> bool:
    head = tensors.get("lm_head.weight")
    return head is None or (head.shape == tensors[embedding_key].shape and torch.equal(head, tensors[embedding_key]))


def _gemma4_from(config: dict, tensors: dict[str, torch.Tensor], name: str):
    if config.get("model_type") == "gemma4":            # multimodal wrapper: keep the text decoder only
        prefix = "model.language_model."
        config = config.get("text_config") or {}
        tensors = {"model." + k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)} | \
                  ({"lm_head.weight": tensors["lm_head.weight"]} if "lm_head.weight" in tensors else {})
    if "model.embed_tokens.weight" not in tensors:
        raise CheckpointError(f"{name}: no model.embed_tokens.weight in the checkpoint")
    tied = _lm_head_is_tied(tensors, "model.embed_tokens.weight")
    if config.get("tie_word_embeddings", True) is False and tied and "lm_head.weight" not in tensors:
        raise CheckpointError(f"{name}: config unties the LM head but the checkpoint has no lm_head.weight")
    cfg = Gemma4Config.from_hf_dict({**config, "tie_word_embeddings": tied}, name=name)
    shared_only = ("k_proj", "v_proj", "k_norm", "v_norm")
    dropped = {f"model.layers.{i}.self_attn.{p}.{w}" for i in range(cfg.num_hidden_layers) if cfg.is_kv_shared(i)
               for p in shared_only for w in ("weight", "bias")}
    return Gemma4ForCausalLM(cfg), {k: v for k, v in tensors.items() if k not in dropped}


def _t5_from(config: dict, tensors: dict[str, torch.Tensor], name: str):
    if "shared.weight" not in tensors:
        raise CheckpointError(f"{name}: no shared.weight in the checkpoint")
    cfg = T5Config.from_hf_dict(config, tie_lm_head=_lm_head_is_tied(tensors, "shared.weight"), name=name)
    dropped = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
               "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"}
    return T5ForConditionalGeneration(cfg), {k: v for k, v in tensors.items() if k not in dropped}


def build_from_config(config: dict, tensors: dict[str, torch.Tensor], name: str = "checkpoint", where=None):
    """(empty model, the tensors it should load) for a parsed config.json and its tensors (`where`: the config
    file, named by an error in the config's values)."""
    model_type = config.get("model_type")
    try:
        if model_type in ("gemma4_text", "gemma4"):
            return _gemma4_from(config, tensors, name)
        if model_type == "t5":
            return _t5_from(config, tensors, name)
    except (Gemma4ConfigError, T5ConfigError) as err:
        raise CheckpointError(f"{where or name}: {err}") from None
    raise CheckpointError(f"{where or name}: model_type {model_type!r} is not supported; minikv runs Gemma-4 "
                          f"(gemma4_text, gemma4) and T5 (t5) checkpoints", hint=UNSUPPORTED_HINT)


def _load_state(model: nn.Module, tensors: dict[str, torch.Tensor], name: str) -> None:
    """Take `tensors` as the model's parameters and persistent buffers (the model may live on the meta device)."""
    wanted = {k: v for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False) or getattr(model.config, "tie_lm_head", False):
        wanted.pop("lm_head.weight")
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    problems = [f"missing {k}" for k in sorted(wanted.keys() - tensors.keys())]
    problems += [f"unexpected {k}" for k in sorted(tensors.keys() - wanted.keys())]
    problems += [f"{k} has shape {tuple(tensors[k].shape)}, config wants {tuple(wanted[k].shape)}"
                 for k in sorted(wanted.keys() & tensors.keys()) if tensors[k].shape != wanted[k].shape]
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise CheckpointError(f"{name}: the weights do not match config.json: {shown}")
    model.load_state_dict(tensors, strict=False, assign=True)
    if isinstance(model, Gemma4ForCausalLM):
        model.model.init_rope_buffers()               # not stored: computed from the config, in float32
        if model.config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight
    elif model.config.tie_lm_head:
        model.lm_head.weight = model.shared.weight


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu",
                    dtype: torch.dtype | None = None) -> nn.Module:
    """The model of a transformers-format directory, in eval mode on `device`, in `dtype` (None: float32 on
    CPU, bfloat16 on CUDA)."""
    path = Path(path)
    config, tensors = read_config(path), read_tensors(path)
    if dtype is None:
        dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    with torch.device("meta"):                         # shapes only: the checkpoint supplies every value
        model, tensors = build_from_config(config, tensors, name=path.name, where=path / CONFIG_FILE)
    _load_state(model, {k: v.to(dtype) for k, v in tensors.items()}, path.name)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def save_checkpoint(model: nn.Module, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write `config.json` and `model.safetensors` so that minikv and transformers both load the directory.
    A tied LM head is not stored (transformers re-ties it from the config)."""
    if not isinstance(model, (Gemma4ForCausalLM, T5ForConditionalGeneration)):
        raise TypeError(f"save_checkpoint takes a minikv Gemma4ForCausalLM or T5ForConditionalGeneration, got "
                        f"{type(model).__name__}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in model.state_dict().items()}
    if model.lm_head.weight is (model.model.embed_tokens.weight if isinstance(model, Gemma4ForCausalLM)
                                else model.shared.weight):
        tensors.pop("lm_head.weight")
    config = model.config.to_hf_dict()
    config["dtype"] = str(next(iter(tensors.values())).dtype).removeprefix("torch.")
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
    (path / DIGEST_FILE).write_text(json.dumps({WEIGHTS_FILE: tensor_digest(tensors)}, indent=2) + "\n")
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return path
