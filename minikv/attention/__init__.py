"""Attention: per-step metadata, the forward context, and the attention impls that read and write the KV cache."""
