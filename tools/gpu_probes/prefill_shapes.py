"""Where the prefill GEMM time goes, transformers' and minikv's, on the checkpoint prefill_peer.py built: each
side's matrix multiplies grouped by input shape (torch.profiler, record_shapes), at 8 prompts of 2,048 tokens, and
the last token's logits of both compared (the same model must be computed).

    python tools/gpu_probes/prefill_shapes.py DIR
"""
from __future__ import annotations

import sys

import torch
from torch.profiler import ProfilerActivity, profile

def table(fn, label):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        out = fn()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in ("aten::mm", "aten::addmm",
                                                                                   "aten::bmm")]
    total = sum(e.device_time_total for e in rows) / 1e3
    print(f"{label}: matrix multiplies {total:.1f} ms of GPU time")
    for e in sorted(rows, key=lambda e: -e.device_time_total)[:14]:
        print(f"  {e.device_time_total / 1e3:8.1f} ms {e.count:5d}x {e.key:11s} {str(e.input_shapes)[:110]}")
    return out


@torch.no_grad()
def transformers_side(transformers, path, ids):
    hf = transformers.Gemma4ForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    print({k: v for k, v in hf.config.to_dict().items() if "intermediate" in k or "wide" in k or "shared" in k})
    dev = ids.cuda()
    return table(lambda: hf(dev, logits_to_keep=1).logits[:, -1].float(), "transformers").cpu()


def main(path: str) -> int:
    import transformers

    import minikv
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 262_144, (8, 2048), generator=g)
    theirs = transformers_side(transformers, path, ids)
    llm = minikv.LLM(model=path, dtype=torch.bfloat16, device="cuda", max_num_seqs=8, max_num_batched_tokens=16384,
                     max_model_len=2064, sanitize=False)
    net = llm.runner.model
    print("minikv MLP widths:", sorted({layer.mlp.gate_proj.out_features for layer in net.model.layers}))
    prompts = [{"prompt_token_ids": row} for row in ids.tolist()]
    params = minikv.SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    outs = table(lambda: llm.generate(prompts, params, use_tqdm=False), "minikv")
    agree = sum(int(o.outputs[0].token_ids[0]) == int(t.argmax()) for o, t in zip(outs, theirs))
    print(f"greedy first token: minikv and transformers agree on {agree} of {len(outs)} prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
