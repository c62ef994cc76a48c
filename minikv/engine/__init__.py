"""The engine: requests and sequences, the scheduler, the model runner and the LLM facade.

The split follows nano-vllm's shape:

- `minikv.engine.sequence`  SamplingParams, Sequence (one request's tokens and cache blocks), RequestOutput;
- `minikv.engine.scheduler` continuous batching: which sequences run next, preemption by recompute;
- `minikv.engine.model_runner` builds the attention metadata of a step and runs the model;
- `minikv.engine.llm`       the `LLM` facade users call.

The block allocator the scheduler drives lives in `minikv.cache.blocks`. Nothing is imported here eagerly, so
importing a light module (the sequence or the scheduler) does not pull in torch or Triton.
"""
