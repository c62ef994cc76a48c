"""Token ids of every shipped model x KV format x scale placement x backend on CUDA, greedy (the GPU side of
the "tokens unchanged" check: compare two runs' files, e.g. results/gpu/tokens_v3_cuda.json). Runs on any minikv
tree:

    PYTHONPATH=TREE python3 tools/gpu_tokens.py OUT.json
"""
import json
import sys
import time

import minikv

out = {}
start = time.time()
for model in ("tiny-gemma4", "tiny-t5"):
    task = minikv.tasks.for_model(model)
    prompts = task.prompts(n=8, seed=123)
    for fmt in ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head"):
        for placement in (("row", "block") if fmt.endswith("per_token_head") else ("row",)):
            for backend in ("torch", "triton"):
                kw = dict(model=model, kv_cache_dtype=fmt, backend=backend, max_num_seqs=4, seed=0, device="cuda")
                if fmt.endswith("per_token_head"):
                    kw["kv_scale_placement"] = placement
                llm = minikv.LLM(**kw)
                outs = llm.generate(prompts, minikv.SamplingParams(max_tokens=10 if model == "tiny-gemma4" else 44))
                key = f"{model}/{fmt}/{placement}/{backend}"
                out[key] = {"prompts": prompts, "ids": [o.token_ids for o in outs],
                            "right": sum(task.check(p, o.text) for p, o in zip(prompts, outs))}
                print(f"{key} {out[key]['right']}/8 right ({time.time() - start:.0f} s)", flush=True)
                with open(sys.argv[1], "w") as f:      # after every run: a time limit keeps what finished
                    json.dump(out, f, indent=1)
