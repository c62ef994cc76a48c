#!/usr/bin/env bash
# Record one `tools/gpu.sh bench` run (the files a device call brought back) as the run notebook 05 and
# docs/results.md draw, on a machine without a GPU, from the repository root:
#
#   bash tools/record_bench.sh FROM NAME
#
# FROM holds the run's gpu_attention.csv and bench.txt (and any of env.txt, tests.txt, commit.txt); they are kept in
# results/gpu/NAME/, the CSV becomes notebooks/data/gpu_attention.csv, notebook 05's CPU cells are re-run from it,
# docs/results.md is re-rendered, and nbval checks notebook 05 in both float environments. PYTHON: the venv's.
set -euo pipefail
cd "$(dirname "$0")/.."
FROM=${1:?usage: bash tools/record_bench.sh FROM NAME}
NAME=${2:?usage: bash tools/record_bench.sh FROM NAME}
PY=${PYTHON:-.venv/bin/python}
for f in gpu_attention.csv bench.txt; do [ -s "$FROM/$f" ] || { echo "$FROM/$f is missing or empty"; exit 2; }; done
mkdir -p "results/gpu/$NAME"
for f in gpu_attention.csv bench.txt env.txt tests.txt commit.txt; do
  [ -e "$FROM/$f" ] && cp "$FROM/$f" "results/gpu/$NAME/"
done
cp "$FROM/gpu_attention.csv" notebooks/data/gpu_attention.csv
export PATH="$PWD/.venv/bin:$PATH" TQDM_DISABLE=1 OMP_NUM_THREADS=1
$PY tools/sync_notebooks.py --cpu-cells notebooks/05_gpu_performance.ipynb
$PY tools/render_results.py
FLAGS="--nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider"
$PY -m pytest -q $FLAGS notebooks/05_gpu_performance.ipynb
OMP_NUM_THREADS=2 ATEN_CPU_CAPABILITY=default $PY -m pytest -q $FLAGS notebooks/05_gpu_performance.ipynb
$PY -m pytest -q -p no:cacheprovider tests/test_results.py tests/test_notebook_pairs.py
echo "recorded results/gpu/$NAME; write its README.md (command, commit, what moved) before committing"
