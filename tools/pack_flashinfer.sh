#!/usr/bin/env bash
# FlashInfer for `python -m minikv.bench attention --peer flashinfer` on a GPU machine without the internet:
# run this where pip can download; it writes into .whl/ (git-ignored, carried to the GPU machine, unpacked by
# tools/gpu.sh's preamble into /tmp/site):
#
#   .whl/apache_tvm_ffi-*.whl      FlashInfer's runtime binding, built for the GPU machine's Python (PYVER, 3.12)
#   .whl/flashinfer.tar.xz         flashinfer-python (pure Python, JIT-compiled there with nvcc) without the CUDA
#                                  sources of kernels the decode benchmark never builds (MoE, GDN, KDA, Blackwell,
#                                  "cake_*", experimental): 62 MB as a wheel, about 13 MB packed this way, so it
#                                  fits one call's transfer limit beside the repository
#
# Usage: bash tools/pack_flashinfer.sh [VERSION]   (default 0.7.2.post1, the version measured in results/gpu/)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-0.7.2.post1}
PYVER=${PYVER:-3.12}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --platform manylinux_2_28_x86_64 \
  -d "$tmp" "flashinfer-python==$VERSION" apache-tvm-ffi
mkdir -p .whl "$tmp/x"
cp "$tmp"/apache_tvm_ffi-*.whl .whl/
(cd "$tmp/x" && python3 -m zipfile -e "$tmp"/flashinfer_python-*.whl . \
  && rm -rf flashinfer/data/csrc/{cake_*,kda,gdn,fused_moe,experimental,blackwell_*} \
  && tar cf - flashinfer flashinfer_python-*.dist-info | xz -6 -T0 > "$OLDPWD/.whl/flashinfer.tar.xz")
ls -la .whl/
