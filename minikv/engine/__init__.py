"""The engine: requests and sequences, the scheduler, the model runner and the LLM facade.

The split follows nano-vllm's shape:

- `minikv.engine.sequence`  Sequence (one request's tokens and cache blocks);
- `minikv.engine.sampling_params`, `outputs`, `prompts`, `chat`  what a request is and returns, in vLLM's shapes:
  SamplingParams; RequestOutput and CompletionOutput; the prompt forms; chat templates;
- `minikv.engine.sampler`   one token per sequence from a step's logits (temperature, min_p, top_k, top_p);
- `minikv.engine.scheduler` continuous batching: which sequences run next, preemption by recompute;
- `minikv.engine.model_runner` builds the attention metadata of a step and runs the model;
- `minikv.engine.step`      StepOutput and StepTrace: what one `LLM.step()` did;
- `minikv.engine.llm`       the `LLM` facade users call (`generate`, or `add_request`/`step` yourself).

The block allocator the scheduler drives lives in `minikv.cache.blocks`. Nothing is imported here eagerly.
`sequence`, `sampling_params`, `outputs`, `prompts` and `step` import no torch at module level (a Sequence imports
it only for a seeded generator); the scheduler does, through `minikv.cache` (the layout and arena are torch code).
"""
