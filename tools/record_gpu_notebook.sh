#!/usr/bin/env bash
# Re-record notebook 05 on a GPU machine that has torch and triton but no network and no notebook runner (the lent
# H200: python 3.12, matplotlib present; jupytext, nbformat, nbclient and ipykernel absent). Three steps, from the
# repo root:
#
#   bash tools/record_gpu_notebook.sh wheels        # here, with the package index: the runner's wheels into .whl/
#   bash tools/record_gpu_notebook.sh gpu           # on the GPU machine (carry .whl/): runs and records 05 into $OUT
#   bash tools/record_gpu_notebook.sh install DIR   # here: copy DIR's notebook and CSV into notebooks/ and check them
#
# `gpu` is `tools/gpu.sh notebook`: it installs .whl/*.whl into /tmp/site, rebuilds the .ipynb from the .py and
# executes every cell there (the benchmark writes notebooks/data/gpu_attention.csv, the CPU cells draw from it and
# check their statements against it). `install` puts the two files in place and runs the pairing test and nbval in
# both float environments, as `make test` does. docs/results.md and the README quote figures of this CSV: update
# them from the new notebook's tables.
set -euo pipefail
cd "$(dirname "$0")/.."
NB=notebooks/05_gpu_performance.ipynb

case "${1:-}" in
  wheels)
    # The runner and its dependencies, minus what the GPU machine already has (numpy, matplotlib, pillow, psutil,
    # pyyaml, markdown-it, and torch's filelock, fsspec, typing_extensions, packaging): a second copy on PYTHONPATH would shadow the machine's own.
    rm -rf .whl && mkdir -p .whl
    .venv/bin/pip download -q --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
      --platform any -d .whl jupytext nbformat nbclient ipykernel "transformers>=5.24"   # transformers: test_parity_gpu.py
    rm -f .whl/numpy-* .whl/matplotlib-* .whl/pillow-* .whl/psutil-* .whl/pyyaml-* .whl/PyYAML-* \
      .whl/markdown_it_py-* .whl/mdurl-* \
      .whl/filelock-* .whl/fsspec-* .whl/typing_extensions-* .whl/packaging-*
    echo "$(ls .whl | wc -l) wheels in .whl/ ($(du -sh .whl | cut -f1)); carry .whl to the GPU machine"
    ;;
  gpu)
    ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/*.whl: run 'bash tools/record_gpu_notebook.sh wheels' first \
and carry .whl" >&2; exit 2; }
    exec bash tools/gpu.sh notebook
    ;;
  install)
    DIR=${2:?"usage: bash tools/record_gpu_notebook.sh install DIR (the folder holding the GPU run's files)"}
    for f in 05_gpu_performance.ipynb gpu_attention.csv; do
      [ -f "$DIR/$f" ] || { echo "$DIR/$f is missing: did the GPU run finish? see $DIR/notebook05.log" >&2; exit 2; }
    done
    if grep -q '"output_type": "error"' "$DIR/05_gpu_performance.ipynb"; then
      echo "$DIR/05_gpu_performance.ipynb holds an error output (see $DIR/notebook05.log): not installed" >&2; exit 1
    fi
    cp "$DIR/05_gpu_performance.ipynb" "$NB"
    cp "$DIR/gpu_attention.csv" notebooks/data/gpu_attention.csv
    FLAGS="--nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider"
    export TQDM_DISABLE=1
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q tests/test_notebook_pairs.py
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q $FLAGS "$NB"
    OMP_NUM_THREADS=2 ATEN_CPU_CAPABILITY=default .venv/bin/python -m pytest -q $FLAGS "$NB"
    echo "installed and checked: git add $NB notebooks/data/gpu_attention.csv"
    ;;
  *)
    sed -n 2,14p "$0"; exit 2
    ;;
esac
