"""The engine: requests and sequences, the scheduler, the model runner and the LLM facade.
See docs/internals.md#engine."""
