"""The engine: requests and sequences, the scheduler, the model runner and the LLM facade.

The split follows nano-vllm's shape:

- `minikv.engine.sequence`  SamplingParams, Sequence (one request's tokens and cache blocks), RequestOutput;
- `minikv.engine.scheduler` continuous batching: which sequences run next, preemption by recompute;
- `minikv.engine.model_runner` builds the attention metadata of a step and runs the model;
- `minikv.engine.step`      StepOutput and StepTrace: what one `LLM.step()` did;
- `minikv.engine.llm`       the `LLM` facade users call (`generate`, or `add_request`/`step` yourself).

The block allocator the scheduler drives lives in `minikv.cache.blocks`. Nothing is imported here eagerly.
`sequence` and `step` import no torch at module level (a Sequence imports it only for a seeded generator); the
scheduler does, through `minikv.cache` (the layout and arena are torch code).
"""
