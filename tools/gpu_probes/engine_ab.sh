#!/usr/bin/env bash
# The engine benchmark on two trees, one after the other on one machine: a baseline (a copy of an earlier commit's
# minikv/ and kernels/, made with `git archive COMMIT minikv kernels | tar -x -C DIR`) and the working tree. Ratios
# between the two are only read from one call of this script.
#
#   bash tools/gpu_probes/engine_ab.sh base DIR OUT [BENCH ARGS...]   # the baseline's rows: OUT/base.txt, base.csv
#   bash tools/gpu_probes/engine_ab.sh new OUT [BENCH ARGS...]        # the working tree's: OUT/new.txt, new.csv
#                                                                     # and, after a baseline, ab_ratios.py's ratios
#
# Run with the repository on PYTHONPATH and minikv/kernels linked to ../kernels, not after `pip install -e .`
# (tools/gpu.sh's preamble), whose finder would import the working tree for the baseline too; each run prints
# which minikv it imported, and the baseline stops if it is not its own.
set -uo pipefail
cd "$(dirname "$0")/../.."
which=$1; shift
if [ "$which" = base ]; then
  dir=$1; shift
  ln -sfn ../kernels "$dir/minikv/kernels"
  export PYTHONPATH="$PWD/$dir${PYTHONPATH:+:$PYTHONPATH}"
fi
out=$1; shift
mkdir -p "$out"
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -c "import minikv, minikv.kernels; print('minikv from', minikv.__file__)" | tee "$out/$which.txt"
# An editable install (pip install -e .) maps `minikv` to the working tree ahead of PYTHONPATH: the "baseline"
# would then be the working tree. Stop rather than compare a tree with itself.
if [ "$which" = base ] && ! grep -q "from $PWD/$dir/minikv/" "$out/$which.txt"; then
  echo "engine_ab.sh: the baseline imported another minikv (an editable install?); use the kernels symlink" \
    "(ln -sfn ../kernels minikv/kernels) instead of pip install -e ." | tee -a "$out/$which.txt"
  exit 1
fi
timeout "${AB_TIMEOUT:-540}" python3 -m minikv.bench engine --device cuda --csv "$out/$which.csv" "$@" 2>&1 \
  | tee -a "$out/$which.txt"
if [ "$which" = new ] && [ -f "$out/base.csv" ] && [ -f "$out/new.csv" ]; then
  python3 tools/gpu_probes/ab_ratios.py "$out/base.csv" "$out/new.csv" | tee -a "$out/new.txt"
fi
