"""`minikv checkpoint new`: a random-weight checkpoint directory in transformers' format, written by minikv alone.

config.json comes from minikv's model configs, model.safetensors (bfloat16) is streamed tensor by tensor in chunks
(E2B's 10 GB never sit in memory at once), tokenizer.json is a byte-level BPE trained here with the `tokenizers`
package. The weights follow transformers' initialization (minikv.models.train.init_weights) from one seed.
"""
from __future__ import annotations

import json
import math
import random
import shutil
import struct
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from minikv.kernels.errors import InvalidValueError
from minikv.models import registry
from minikv.models.gemma4 import FULL, SLIDING, Gemma4Config, Gemma4ForCausalLM
from minikv.models.t5 import T5Config, T5ForConditionalGeneration

SIZES = {"gemma4": ("tiny", "e2b"), "t5": ("tiny", "base")}
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>"]        # Gemma's ids: pad 0, eos 1, bos 2
T5_SPECIALS = ["<pad>", "</s>", "<unk>"]            # flan-t5's ids: pad 0, eos 1, unk 2
STORED = torch.bfloat16
CHUNK = 1 << 24                                     # elements drawn at a time


def gemma4_config(size: str, vocab: int) -> dict:
    """config.json's keys: `e2b` is gemma-4-E2B's text config in full (5.1 B parameters); `tiny` keeps its
    pattern (sliding and full layers, KV sharing, per-layer inputs, double-wide MLPs) in 5 layers of width 32."""
    ids = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
    if size == "e2b":
        return registry.CHECKPOINT_CONFIGS["tiny-gemma4-e2b"] | registry.E2B_SHRUNK | ids
    return {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", "vocab_size": vocab,
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 5, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 16, "global_head_dim": 32,
            "layer_types": [SLIDING, SLIDING, FULL, SLIDING, FULL], "sliding_window": 8, "num_kv_shared_layers": 2,
            "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": vocab, "use_double_wide_mlp": True,
            "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6,
            "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_k_eq_v": False,
            "enable_moe_block": False,
            "rope_parameters": {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
                                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                       "rope_theta": 1_000_000.0}}} | ids


def t5_config(size: str, vocab: int) -> dict:
    """`base`: flan-t5-base's dimensions (vocabulary 32,128); `tiny`: 2 + 2 layers of width 32."""
    dims = (dict(vocab_size=32_128, d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_decoder_layers=12,
                 num_heads=12, relative_attention_max_distance=128) if size == "base" else
            dict(vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                 relative_attention_max_distance=64))
    return {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "is_encoder_decoder": True,
            **dims, "relative_attention_num_buckets": 32, "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False, "layer_norm_epsilon": 1e-6, "dropout_rate": 0.0, "pad_token_id": 0,
            "eos_token_id": 1, "decoder_start_token_id": 0}


def build_tokenizer(specials: list[str], vocab_size: int = 400, seed: int = 0, t5_template: bool = False):
    """A byte-level BPE trained on arithmetic sequences and a few words (numbers merge as a real BPE merges them);
    for T5, flan-t5's post-processor (`$A </s>`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    rng = random.Random(seed)
    corpus = []
    for _ in range(3000):
        first, step = rng.randint(0, 999), rng.randint(1, 99)
        corpus.append(" ".join(str(first + i * step) for i in range(rng.randint(2, 20))))
    corpus += ["the quick brown fox jumps over the lazy dog", "continue the sequence", "hello world"] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    if t5_template:
        tok.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B:1 </s>:1", special_tokens=[("</s>", tok.token_to_id("</s>"))])
    return tok


def _model_on_meta(arch: str, config: dict) -> nn.Module:
    with torch.device("meta"):
        if arch == "gemma4":
            return Gemma4ForCausalLM(Gemma4Config.from_hf_dict(config, name="checkpoint"))
        return T5ForConditionalGeneration(T5Config.from_hf_dict(config, tie_lm_head=False, name="checkpoint"))


def init_rules(model: nn.Module) -> dict[str, float | None]:
    """Tensor name -> the std of its normal draw (transformers' initialization), 0.0 for a bias, None for a
    tensor that starts at ones (norm weights, layer scalars). A tied LM head is left out (not stored)."""
    if isinstance(model, Gemma4ForCausalLM):
        def std_of(name, module):
            return 0.02
    else:
        c = model.config
        stds = {"q": (c.d_model * c.d_kv) ** -0.5, "k": c.d_model ** -0.5, "v": c.d_model ** -0.5,
                "o": (c.num_heads * c.d_kv) ** -0.5, "wi_0": c.d_model ** -0.5, "wi_1": c.d_model ** -0.5,
                "wi": c.d_model ** -0.5, "wo": c.d_ff ** -0.5, "relative_attention_bias": c.d_model ** -0.5,
                "shared": 1.0, "lm_head": c.d_model ** -0.5}

        def std_of(name, module):
            return stds[name.rsplit(".", 1)[-1]]
    drawn = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            drawn[f"{name}.weight"] = std_of(name, module)
            if getattr(module, "bias", None) is not None:
                drawn[f"{name}.bias"] = 0.0
    rules = {k: drawn.get(k) for k in model.state_dict()}
    tied = model.lm_head.weight is (model.model.embed_tokens.weight if isinstance(model, Gemma4ForCausalLM)
                                    else model.shared.weight)
    if tied:
        rules.pop("lm_head.weight")
    return rules


def _tensor_bytes(shape, std: float | None, generator: torch.Generator):
    """The stored bytes of one tensor, chunk by chunk (rows of its first dimension)."""
    rows = shape[0] if shape else 1
    per_row = math.prod(shape[1:]) if len(shape) > 1 else 1
    step = max(1, CHUNK // per_row)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        shape_n = (n, *shape[1:]) if shape else ()
        if std is None:
            values = torch.ones(shape_n)
        elif std == 0.0:
            values = torch.zeros(shape_n)
        else:
            values = torch.randn(shape_n, generator=generator) * std
        yield values.to(STORED).reshape(-1).view(torch.uint8).numpy().tobytes()


def write_safetensors(path: Path, shapes: dict[str, tuple], rules: dict, seed: int, progress: bool) -> int:
    """model.safetensors in bfloat16, written in a stream (the format: 8-byte header length, the JSON header with
    each tensor's offsets, then the bytes). Returns the bytes written."""
    names = sorted(shapes)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        size = math.prod(shapes[name]) * STORED.itemsize
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    generator = torch.Generator().manual_seed(seed)
    with open(path, "wb") as f, tqdm(total=offset, unit="B", unit_scale=True, desc=f"writing {path.name}",
                                     leave=False, **({} if progress else {"disable": True})) as bar:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name in names:
            for chunk in _tensor_bytes(shapes[name], rules[name], generator):
                f.write(chunk)
                bar.update(len(chunk))
    return 8 + len(blob) + offset


def check_target(path: Path, force: bool) -> None:
    if path.exists() and not path.is_dir():
        raise InvalidValueError(f"{str(path)!r} exists and is not a directory: give a new directory's path")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise InvalidValueError(f"{str(path)!r} exists and is not empty: give a new directory, or --force to "
                                f"write over its checkpoint files")


def plan(arch: str, size: str, vocab: int) -> tuple[dict, nn.Module]:
    """(config.json's dict, the model on the meta device) for `arch` at `size`, checked."""
    if arch not in SIZES:
        raise InvalidValueError(f"unknown architecture {arch!r}; choose one of {', '.join(SIZES)}")
    if size not in SIZES[arch]:
        raise InvalidValueError(f"{arch} comes in sizes {' and '.join(SIZES[arch])}, not {size!r}")
    config = gemma4_config(size, vocab) if arch == "gemma4" else t5_config(size, vocab)
    model = _model_on_meta(arch, config)
    return config | {"dtype": "bfloat16"}, model


def write(path: str | Path, arch: str = "gemma4", size: str = "tiny", seed: int = 0, force: bool = False,
          progress: bool = True) -> Path:
    """Write a random checkpoint of `arch` at `size` into directory `path` (new or empty, or any with `force`):
    config.json, model.safetensors, tokenizer.json and tokenizer_config.json. Everything is checked (the
    directory, the sizes, the free disk space) before anything is written."""
    path = Path(path)
    check_target(path, force)
    tok = build_tokenizer(GEMMA_SPECIALS if arch == "gemma4" else T5_SPECIALS, seed=seed, t5_template=arch == "t5")
    config, model = plan(arch, size, vocab=-(-tok.get_vocab_size() // 64) * 64)
    rules = init_rules(model)
    state = model.state_dict()
    shapes = {k: tuple(state[k].shape) for k in rules}
    need = sum(math.prod(s) for s in shapes.values()) * STORED.itemsize
    free = shutil.disk_usage(path if path.exists() else path.parent if path.parent.exists() else ".").free
    if need > free:
        raise InvalidValueError(f"the {arch} {size} checkpoint needs {need / 2**30:.1f} GiB but {path} has only "
                                f"{free / 2**30:.1f} GiB free: choose a directory on a larger disk")
    path.mkdir(parents=True, exist_ok=True)
    for stale in [*path.glob("model-*.safetensors"), path / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)           # --force: a sharded checkpoint there would shadow the new file
    write_safetensors(path / "model.safetensors", shapes, rules, seed, progress)
    (path / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tok.save(str(path / "tokenizer.json"))
    specials = GEMMA_SPECIALS if arch == "gemma4" else T5_SPECIALS
    tokenizer_config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": specials[0],
                        "eos_token": specials[1], "model_max_length": model.config.max_position}
    tokenizer_config |= {"bos_token": "<bos>"} if arch == "gemma4" else {"unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    return path
