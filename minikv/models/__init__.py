"""The models minikv ships and runs: tiny-gemma4 (Gemma-4 text decoder, KV-sharing layers) and tiny-t5 (T5)."""
