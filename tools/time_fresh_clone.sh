#!/usr/bin/env bash
# Time CI's job from a fresh clone of HEAD: `git clone`, then `bash .ci/run` (which builds its own .venv and runs
# `make test`) under /usr/bin/time -v. Writes results/cpu/ci_run.log, which tools/render_results.py reads for the
# README's test time (source `test_time`). Run it on an otherwise idle machine: the figure is wall time.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
log=$repo/results/cpu/ci_run.log
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/minikv"
{
  echo "\$ bash tools/time_fresh_clone.sh"
  echo "commit $(git rev-parse --short HEAD), $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs," \
       "load average before: $(cut -d' ' -f1 /proc/loadavg)"
} > "$log.tmp"
status=0
(cd "$work/minikv" && /usr/bin/time -v bash .ci/run) >> "$log.tmp" 2>&1 || status=$?
echo "exit status $status, load average after: $(cut -d' ' -f1 /proc/loadavg)" >> "$log.tmp"
mv "$log.tmp" "$log"
tail -n 3 "$log"
exit "$status"
