"""Random-weight checkpoint directories written by transformers, with a tokenizer.json built here: what a user's
real checkpoint looks like to minikv (config.json, bf16 safetensors, sharded or not, a Hugging Face tokenizer), made
without any download. The tests use small ones; the GPU run (`bash tools/gpu.sh fidelity`) builds full-size ones.

    python tools/random_checkpoints.py gemma4 DIR [--dims tiny|e2b] [--shard 2GB]
    python tools/random_checkpoints.py t5 DIR [--dims tiny|flan-t5-base] [--shard 100KB]

* gemma4 `e2b`: gemma-4-E2B's text config in full (35 layers, hidden 1536, vocabulary 262,144, per-layer inputs,
  double-wide MLPs on the 20 KV-sharing layers, heads 256/512; 5.1 B parameters, about 10 GB in bf16);
  `tiny`: the same layer pattern in 5 layers of width 32, for tests.
* t5 `flan-t5-base`: flan-t5-base's dimensions (d_model 768, 12 heads of 64, d_ff 2048, 12 + 12 layers, 32 buckets
  up to distance 128, vocabulary 32,128, untied head); `tiny`: 2 + 2 layers of width 32.
* the tokenizer: a byte-level BPE trained here on arithmetic sequences and words (about 400 tokens; `<pad>` 0,
  `<eos>` 1, `<bos>` 2, as Gemma's ids), so prompts round-trip exactly and numbers are split as a real BPE splits them.

Weights are transformers' own initialization under `torch.manual_seed(seed)`; with `--randomize`, every parameter
(norms included) is drawn at random, so no term of the forward pass hides behind an identity.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

SPECIALS = ["<pad>", "<eos>", "<bos>"]
S, F = "sliding_attention", "full_attention"


def build_tokenizer(path: Path, vocab_size: int = 400, seed: int = 0) -> Path:
    """Train a byte-level BPE on arithmetic sequences and a few words; write `path`/tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    rng = random.Random(seed)
    corpus = []
    for _ in range(3000):
        first, step = rng.randint(0, 999), rng.randint(1, 99)
        corpus.append(" ".join(str(first + i * step) for i in range(rng.randint(2, 20))))
    corpus += ["the quick brown fox jumps over the lazy dog", "continue the sequence", "hello world"] * 50
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path / "tokenizer.json"


def gemma4_config(dims: str, vocab: int):
    import transformers
    if dims == "e2b":
        kw = dict(vocab_size=262_144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35,
                  num_attention_heads=8, num_key_value_heads=1, head_dim=256, global_head_dim=512,
                  layer_types=[S, S, S, S, F] * 7, sliding_window=512, num_kv_shared_layers=20,
                  hidden_size_per_layer_input=256, vocab_size_per_layer_input=262_144, use_double_wide_mlp=True,
                  final_logit_softcapping=30.0, max_position_embeddings=131_072)
    else:
        kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, S, F, S, F],
                  sliding_window=8, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                  vocab_size_per_layer_input=vocab, use_double_wide_mlp=True, final_logit_softcapping=30.0,
                  max_position_embeddings=128)
    return transformers.Gemma4TextConfig(**kw, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                                         attn_implementation="sdpa")


def t5_config(dims: str, vocab: int):
    import transformers
    if dims == "flan-t5-base":
        kw = dict(vocab_size=32_128, d_model=768, d_kv=64, d_ff=2048, num_layers=12, num_decoder_layers=12,
                  num_heads=12, relative_attention_max_distance=128)
    else:
        kw = dict(vocab_size=vocab, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
                  relative_attention_max_distance=64)
    return transformers.T5Config(**kw, relative_attention_num_buckets=32, feed_forward_proj="gated-gelu",
                                 tie_word_embeddings=False, pad_token_id=0, eos_token_id=1,
                                 decoder_start_token_id=0, dropout_rate=0.0)


def write(kind: str, path: str | Path, dims: str = "tiny", shard: str | None = None, seed: int = 0,
          randomize: bool = False, device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> Path:
    """A random checkpoint directory of `kind` ("gemma4" or "t5") at `dims`, saved by transformers in `dtype`
    (sharded into files of at most `shard`, e.g. "2GB", when given), with the BPE tokenizer.json beside it."""
    import transformers
    path = Path(path)
    tokenizer = build_tokenizer(path)
    vocab = json.loads(tokenizer.read_text())["model"]["vocab"]
    vocab_size = -(-len(vocab) // 64) * 64                    # room for every tokenizer id, rounded up
    torch.manual_seed(seed)
    with torch.device(device):
        if kind == "gemma4":
            model = transformers.Gemma4ForCausalLM(gemma4_config(dims, vocab_size))
        elif kind == "t5":
            model = transformers.T5ForConditionalGeneration(t5_config(dims, vocab_size))
        else:
            raise ValueError(f"kind must be 'gemma4' or 't5', got {kind!r}")
    if randomize:
        g = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g, device=device) * (0.3 if p.dim() == 1 else 0.25)
                        + (p.dim() == 1))
    model = model.to(dtype).eval()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=("gemma4", "t5"))
    p.add_argument("path")
    p.add_argument("--dims", default="tiny", choices=("tiny", "e2b", "flan-t5-base"))
    p.add_argument("--shard", default=None, help="largest shard, e.g. 2GB (default: one file)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--randomize", action="store_true")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    print(write(args.kind, args.path, args.dims, args.shard, args.seed, args.randomize, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
