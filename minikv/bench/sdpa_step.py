"""`python -m minikv.bench.sdpa_step`: the E2B-like model's decode step with torch SDPA over a contiguous cache (GPU).
See docs/internals.md#bench-sdpa-step."""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F


def e2b_like_config(full_head_dim: int = 512, **overrides) -> dict:
    """The `gemma4_text` config.json dict of the engine bench's gemma-4-E2B-like model."""
    from minikv.models.gemma4 import FULL, SLIDING
    from minikv.models.tokenizer import CharTokenizer
    vocab = CharTokenizer().vocab_size
    layers = overrides.get("num_hidden_layers", 35)
    layer_types = overrides.pop("layer_types", [FULL if i % 5 == 4 else SLIDING for i in range(layers)])
    return {"model_type": "gemma4_text", "vocab_size": vocab, "hidden_size": 1536, "intermediate_size": 6144,
            "num_hidden_layers": layers, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256,
            "per_layer_config": {i: {"head_dim": full_head_dim, "num_key_value_heads": 1}
                                 for i, t in enumerate(layer_types) if t == FULL},
            "layer_types": layer_types, "sliding_window": 512, "num_kv_shared_layers": 20,
            "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": vocab,
            "final_logit_softcapping": 30.0, "max_position_embeddings": 4096, **overrides}


def e2b_like_model(device="cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0, **overrides):
    """Gemma4ForCausalLM of `e2b_like_config(**overrides)` with random weights (seeded: the same seed, the same
    weights), in `dtype`, in eval mode, no gradients."""
    from minikv.models.gemma4 import Gemma4Config, Gemma4ForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = Gemma4ForCausalLM(Gemma4Config.from_hf_dict(e2b_like_config(**overrides))).to(dtype).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn_like(p) * (0.05 if p.dim() == 1 else 0.02) + (p.dim() == 1))
    return model.requires_grad_(False)


class SdpaDecodeStep:
    """One decode step of `model` for `batch` sequences of `context` tokens, over contiguous caches."""

    def __init__(self, model, batch: int, context: int, seed: int = 0):
        c = model.config
        dev, dt = model.lm_head.weight.device, model.lm_head.weight.dtype
        self.model, self.batch, self.context = model, batch, context
        gen = torch.Generator(device=dev).manual_seed(seed)
        self.caches = {i: tuple(torch.randn(batch, c.layer_kv_heads[i], context, c.layer_head_dims[i], device=dev,
                                            generator=gen).to(dt) for _ in "kv")
                       for i in range(c.num_hidden_layers) if c.kv_sources[i] == i}
        self.input_ids = torch.randint(c.vocab_size, (batch,), device=dev, generator=gen)
        self.positions = torch.full((batch, 1), context - 1, dtype=torch.long, device=dev)

    @torch.no_grad()
    def logits(self) -> torch.Tensor:
        m, c, b, last = self.model.model, self.model.config, self.batch, self.context - 1
        ids = self.input_ids[:, None]
        x = m.embed_tokens(ids)                                                   # [B, 1, H]
        ple = m.per_layer_inputs(ids, x) if c.hidden_size_per_layer_input else None
        rope = {t: m.rope(t, self.positions, x.dtype) for t in set(c.layer_types)}
        h = m.layers[0].input_layernorm(x)
        for i, layer in enumerate(m.layers):
            attn, (cos, sin) = layer.self_attn, rope[c.layer_types[i]]
            q, k, v = attn.project(h, cos, sin)                                  # the model's own code
            if not attn.kv_shared:                                                # k, v: [B, 1, kv_heads, D]
                self.caches[i][0][:, :, last] = k[:, 0]
                self.caches[i][1][:, :, last] = v[:, 0]
            k_cache, v_cache = self.caches[c.kv_sources[i]]
            start = 0 if attn.window is None else max(0, self.context - attn.window)
            groups = q.view(b, attn.num_kv_heads, attn.num_heads // attn.num_kv_heads, attn.head_dim)
            out = F.scaled_dot_product_attention(groups, k_cache[:, :, start:], v_cache[:, :, start:], scale=1.0)
            x, h = layer.post_attention_layernorm(attn.o_proj(out.reshape(b, 1, -1)), residual=x,
                                                  then=layer.pre_feedforward_layernorm)
            then = m.layers[i + 1].input_layernorm if i + 1 < len(m.layers) else m.norm
            x, h = layer.feed_forward(x, None if ple is None else ple[i], h, then)   # the model's own code
        return self.model.compute_logits(h)[:, 0]

    def __call__(self) -> torch.Tensor:
        return self.logits().argmax(dim=-1)


def step_ms(batch: int, context: int, reps: int = 20, **overrides):
    """minikv.bench.timing.Timing of the E2B-like model's SDPA decode step at `batch` x `context` on CUDA, captured
    in a CUDA graph (Timing.how says "eager" if it could not be captured)."""
    from minikv.bench.timing import time_ms
    step = SdpaDecodeStep(e2b_like_model("cuda", **overrides), batch, context)
    timing = time_ms(step, "cuda", reps=reps, graph=True)
    del step
    torch.cuda.empty_cache()
    return timing


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minikv.bench.sdpa_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--context", type=int, nargs="+", default=[2048])
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 0
    for b in args.batch:
        for ctx in args.context:
            ms, how = step_ms(b, ctx)
            print(f"E2B-like SDPA decode step, batch {b}, context {ctx}: {ms:.3f} ms ({how}), "
                  f"{1e3 * b / ms:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
