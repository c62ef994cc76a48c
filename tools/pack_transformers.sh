#!/usr/bin/env bash
# transformers for the GPU machine without the internet: the `--peer transformers` rows of `minikv.bench engine`,
# tests/test_parity_gpu.py and `tools/gpu.sh fidelity / memcheck` need the version pyproject.toml pins for dev,
# newer than the machine's own. Run this where pip can download; it writes the wheels into .whl/ (git-ignored,
# carried to the GPU machine, installed by tools/gpu.sh's preamble into /tmp/site):
#
#   transformers and the packages it needs that the GPU machine lacks or has too old (tokenizers, safetensors,
#   huggingface_hub, hf-xet, httpx, typer; httpx2, httpcore2, truststore and h11, which huggingface_hub 2.x
#   imports), each at the version this checkout's .venv has, else pip's choice
#
# Usage: bash tools/pack_transformers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
pin=$(grep -o 'transformers==[0-9.]*' pyproject.toml)
mkdir -p .whl
for pkg in "$pin" tokenizers safetensors huggingface_hub hf-xet httpx typer httpx2 httpcore2 truststore h11; do
  have=$($PY -m pip show "${pkg%%==*}" 2>/dev/null | awk '/^Version:/{print $2}')
  [[ "$pkg" == *==* || -z "$have" ]] || pkg="$pkg==$have"
  $PY -m pip download -q --no-deps -d .whl "$pkg"      # abi3 or pure-Python wheels: any Python 3.10+ takes them
done
ls -la .whl/
