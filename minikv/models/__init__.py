"""The tiny models minikv ships: tiny-kvshare (decoder-only, KV-sharing layers) and tiny-encdec (T5-like)."""
