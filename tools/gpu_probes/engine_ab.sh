#!/usr/bin/env bash
# The engine benchmark on two trees, one after the other on one machine: a baseline (a copy of an earlier commit's
# minikv/ and kernels/, made with `git archive COMMIT minikv kernels | tar -x -C DIR`) and the working tree. Ratios
# between the two are only read from one call of this script.
#
#   bash tools/gpu_probes/engine_ab.sh base DIR OUT [BENCH ARGS...]   # the baseline's rows: OUT/base.txt, base.csv
#   bash tools/gpu_probes/engine_ab.sh new OUT [BENCH ARGS...]        # the working tree's: OUT/new.txt, new.csv
#                                                                     # and, after a baseline, ab_ratios.py's ratios
#
# The baseline runs from its own directory, because `python -m` puts the working directory first on sys.path (run
# from the repository, the "baseline" imports the working tree), with minikv/kernels linked to ../kernels. Each
# run prints which minikv it imported, and the baseline stops if it is not its own (as after `pip install -e .`
# with no copy of minikv in DIR).
set -uo pipefail
cd "$(dirname "$0")/../.."
which=$1; shift
root=$PWD
if [ "$which" = base ]; then
  dir=$(realpath "$1"); shift
fi
mkdir -p "$1"
out=$(realpath "$1"); shift
if [ "$which" = base ]; then
  ln -sfn ../kernels "$dir/minikv/kernels"
  export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
  cd "$dir"          # python -m puts the working directory first on sys.path: the baseline's, not the repository's
fi
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
python3 -c "import minikv, minikv.kernels; print('minikv from', minikv.__file__)" | tee "$out/$which.txt"
# Should another minikv come first (the working tree's, through an editable install or the path), the "baseline"
# would be the working tree. Stop rather than compare a tree with itself.
if [ "$which" = base ] && ! grep -q "from $dir/minikv/" "$out/$which.txt"; then
  echo "engine_ab.sh: the baseline imported another minikv (no minikv/ in $dir, or an editable install?);" \
    "copy one with git archive, and link minikv/kernels instead of pip install -e ." | tee -a "$out/$which.txt"
  exit 1
fi
timeout "${AB_TIMEOUT:-540}" python3 -m minikv.bench engine --device cuda --csv "$out/$which.csv" "$@" 2>&1 \
  | tee -a "$out/$which.txt"
if [ "$which" = new ] && [ -f "$out/base.csv" ] && [ -f "$out/new.csv" ]; then
  python3 "$root/tools/gpu_probes/ab_ratios.py" "$out/base.csv" "$out/new.csv" | tee -a "$out/new.txt"
fi
