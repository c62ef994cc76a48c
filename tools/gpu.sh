#!/usr/bin/env bash
# Everything minikv runs on a CUDA machine, from the repo root, with one preamble (install without downloads,
# wheels carried in .whl/ put on PYTHONPATH, versions printed):
#
#   bash tools/gpu.sh tests      # `make test-gpu`: the tests marked gpu (pytest-xdist workers: compiling Triton
#                                #   kernels is CPU work) beside both reproductions on CUDA; the wall time last
#   bash tools/gpu.sh repro      # both reproductions on CUDA
#   bash tools/gpu.sh bench      # one run of `minikv.bench attention --engine` (the kernel targets, FlashInfer
#                                #   beside minikv when importable, then the engine's): $OUT/gpu_attention.csv
#   bash tools/gpu.sh tune       # the launch-configuration sweep and an Nsight Compute profile of the decode kernel
#   bash tools/gpu.sh fidelity   # the full-size random checkpoints against transformers, both repros on them
#   bash tools/gpu.sh memcheck   # defect B1 under compute-sanitizer (tools/memcheck_cross_stride.py)
#   bash tools/gpu.sh tokens     # token ids of every shipped model, format, placement and backend on CUDA
#
# Several steps in one call run in order: `bash tools/gpu.sh tests bench`. Logs and results go to $OUT (default
# build/gpu); PYTHON picks the interpreter (default python3); TRITON_CACHE_DIR=fresh starts from an empty kernel
# cache (what a fresh machine has). The exit status is 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1
if [ "${TRITON_CACHE_DIR:-}" = fresh ]; then export TRITON_CACHE_DIR=$(mktemp -d); fi
status=0
[ $# -gt 0 ] || { sed -n '2,18p' "$0"; exit 2; }
for step in "$@"; do
  case "$step" in
    tests|repro|bench|tune|fidelity|memcheck|tokens) ;;
    *) echo "unknown step '$step': choose from tests repro bench tune fidelity memcheck tokens"; exit 2 ;;
  esac
done

# ---- the one preamble -------------------------------------------------------------------------------------------
if [ -z "${WHEELS_INSTALLED:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export WHEELS_INSTALLED=1
fi
# packed packages (tools/pack_flashinfer.sh: FlashInfer without the sources the benchmark never builds)
for packed in .whl/*.tar.xz; do
  [ -e "$packed" ] && [ ! -e "/tmp/site/.$(basename "$packed").done" ] || continue
  mkdir -p /tmp/site && tar -xJf "$packed" -C /tmp/site && touch "/tmp/site/.$(basename "$packed").done"
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}:/tmp/site"
$PY -c "import minikv.kernels" 2>/dev/null || $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . \
  >/dev/null 2>&1 || true
$PY -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
$PY - <<'PY' | tee "$OUT/env.txt"
import torch, triton, minikv.kernels as k
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print("gpu:", gpu, "| torch", torch.__version__, "| triton", triton.__version__, "| kernels:", k.mode.mode_name())
PY

# ---- steps ------------------------------------------------------------------------------------------------------
tests() {
  local tmp start par
  tmp=$(mktemp -d); start=$(date +%s)
  par=$($PY - "${GPU_TEST_WORKERS:-8}" <<'PY'
import sys
try:
    import xdist
    major, minor = (int(x) for x in xdist.__version__.split(".")[:2])
    print(f"-n {sys.argv[1]}" + (" --dist worksteal" if (major, minor) >= (3, 2) else ""))
except ImportError:
    print("")
PY
)
  [ -n "$par" ] || echo "(pytest-xdist missing: the tests run one at a time)"
  ( $PY -m minikv repro scale-wipe --device cuda > "$tmp/wipe.log" 2>&1; echo $? > "$tmp/wipe.rc" ) &
  ( $PY -m minikv repro cross-stride --device cuda > "$tmp/cross.log" 2>&1; echo $? > "$tmp/cross.rc" ) &
  $PY -m pytest -q -m gpu -p no:cacheprovider $par --durations=15 ${GPU_TESTS:-tests/test_kernels_gpu.py \
    tests/test_rms_norm.py tests/test_gpu_engine.py tests/test_gpu_graphs.py tests/test_engine.py tests/test_engine_perlayer.py \
    tests/test_parity_gpu.py tests/test_backends.py tests/test_backend_hunt.py tests/test_memory_budget.py \
    tests/test_request_path.py tests/test_inputs.py tests/test_decode_matmul.py}
  local rc=$?
  wait
  for r in wipe cross; do
    echo "== minikv repro $([ $r = wipe ] && echo scale-wipe || echo cross-stride) --device cuda (exit $(cat $tmp/$r.rc))"
    cat "$tmp/$r.log"
    [ "$(cat $tmp/$r.rc)" = 0 ] || rc=1
  done
  echo "make test-gpu: exit status $rc, $(( $(date +%s) - start )) s wall ($(nproc) CPU cores, ${par:-serial}," \
       "Triton cache ${TRITON_CACHE_DIR:-default})"
  return $rc
}

repro() {
  timeout 70 $PY -m minikv repro scale-wipe --device cuda || return 1
  timeout 45 $PY -m minikv repro cross-stride --device cuda
}

# FlashInfer JIT-compiles each decode variant at its first plan (about a minute each): the four side by side.
warm_flashinfer() {
  local start=$(date +%s) v
  for v in "auto tensor-cores" "auto cuda-cores" "fp8 tensor-cores" "fp8 cuda-cores"; do
    $PY -m minikv.bench.flashinfer_peer $v > "$OUT/flashinfer-warm-${v// /-}.log" 2>&1 &
  done
  wait
  tail -q -n 1 "$OUT"/flashinfer-warm-*.log
  echo "flashinfer variants compiled in $(( $(date +%s) - start )) s"
}

# BENCH_PART=kernels, then BENCH_PART=engine in a later call on the same machine (CSV=... naming the first call's
# CSV, carried back), splits the one recording where it does not fit one call; ENGINE_ARGS: the engine part's
# `minikv.bench engine` arguments (e.g. "--capacity --peer transformers").
bench() {
  local peer="" start rc part=${BENCH_PART:-all} csv=${CSV:-$OUT/gpu_attention.csv} what="--engine"
  [ "$part" = kernels ] && what=""
  [ "$part" = engine ] && what="--engine-only"
  if [ "$part" = engine ]; then :
  elif $PY -c "import flashinfer" 2>/dev/null; then peer="--peer flashinfer"; warm_flashinfer
  else echo "(flashinfer not importable: no peer column; tools/pack_flashinfer.sh packs it into .whl/)"; fi
  start=$(date +%s)
  # one run, one CSV: the rows notebook 05 draws (copy it to notebooks/data/gpu_attention.csv)
  timeout ${BENCH_TIMEOUT:-540} $PY -m minikv.bench attention $what --csv "$csv" $peer ${ATTENTION_ARGS:-} \
    --engine-args "${ENGINE_ARGS:-}" 2>&1 | tee -a "$OUT/bench.txt"
  rc=${PIPESTATUS[0]}
  echo "bench: exit status $rc, $(( $(date +%s) - start )) s wall"
  return $rc
}

tune() {
  timeout ${SWEEP_TIMEOUT:-330} $PY -m minikv.bench.attention_sweep --out "$OUT" ${SWEEP_ARGS:-} 2>&1 \
    | tee "$OUT/sweep.log" | grep -v "^  failed" | tail -60
  timeout 150 /usr/local/cuda/bin/ncu --clock-control none --target-processes all -k regex:_decode_ \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    --section WarpStateStats --csv --page details $PY -m minikv.bench.profile_decode run ${PROFILE_FORMATS:-} \
    > "$OUT/ncu_decode.csv" 2> "$OUT/ncu.err"
  echo "ncu exit $?"; tail -3 "$OUT/ncu.err"
  $PY -m minikv.bench.profile_decode summarize "$OUT/ncu_decode.csv" | tee "$OUT/ncu_summary.txt"
}

# memcheck / fidelity need transformers >= 5.24 (tools/pack_transformers.sh puts its wheels in .whl/; the machine's
# own is older).
# DRY=1: a dry run on a CPU machine at small dimensions, without the sanitizer (PYTHON=.venv/bin/python there).
# PADDING: bytes of unallocated padding memcheck puts after every CUDA allocation (default 1 MiB). Without it the
# driver packs small cudaMallocs back to back, so an overrun of one pool lands inside the next allocation, which
# memcheck counts as valid memory (silently wrong tokens with separate pools too); PADDING=0 leaves it out.
if [ -n "${DRY:-}" ]; then
  SANITIZER=""; DIMS="tiny cpu"; DEVICE=cpu
else
  PAD=${PADDING-1048576}
  SANITIZER="compute-sanitizer --tool memcheck --print-limit 4${PAD:+ --padding $PAD}"; DIMS=""; DEVICE=cuda
  [ "$PAD" = 0 ] && SANITIZER="compute-sanitizer --tool memcheck --print-limit 4"
fi

memcheck() {
  # defect B1 under compute-sanitizer (tools/memcheck_cross_stride.py): one arena (the overrun stays inside the
  # allocation: no report, silently wrong tokens) against one allocation per pool (TensorRT-LLM's shape:
  # out-of-bounds accesses reported), the fixed backend and a 2x pool (no report)
  local rc=0 cases="one-arena-historical-1.5x per-pool-historical-1.5x per-pool-fixed-1.5x per-pool-historical-2x"
  [ -z "$SANITIZER" ] || compute-sanitizer --version 2>&1 | head -3
  timeout 40 $PY tools/memcheck_cross_stride.py reference /tmp/memcheck_ref.json || rc=1
  # compile the historical kernels once without the sanitizer (the one-arena case stays inside its allocation)
  timeout 30 $PY tools/memcheck_cross_stride.py one-arena-historical-1.5x --reference /tmp/memcheck_ref.json \
    2>&1 | grep RESULT | sed 's/^RESULT/warm-up, no sanitizer:/'
  for case in $cases; do                       # one process each, side by side on the one GPU
    ( echo "== ${SANITIZER:-no sanitizer (dry run)}: $case"
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 60 $SANITIZER $PY tools/memcheck_cross_stride.py "$case" \
        --reference /tmp/memcheck_ref.json 2>&1 | grep -v "Host Frame"
      echo "== exit status ${PIPESTATUS[0]}" ) > "/tmp/memcheck_$case.txt" &
  done
  wait
  for case in $cases; do cat "/tmp/memcheck_$case.txt"; done
  return $rc
}

fidelity() {
  # gemma-4-E2B's full text model with random weights, built and saved (bf16, sharded) by transformers with a
  # tokenizer.json: minikv loads it and matches transformers' logits, then the scale-wipe repro on it; the same at
  # flan-t5-base's dimensions, then the cross-stride repro (B1 thresholds, B2) on it, beside the E2B steps
  local rc=0
  ( rm -rf /tmp/t5b
    timeout 60 $PY tools/fullsize_parity.py t5 /tmp/t5b $DIMS 2>&1 | grep -v "Writing\|deprecated\|output = func"
    timeout 120 $PY -m minikv repro cross-stride --model /tmp/t5b --device $DEVICE 2>&1 | grep -v "falls back"
  ) > "$OUT/flan_t5_base_fullsize.log" 2>&1 &
  rm -rf /tmp/e2b
  timeout 120 $PY tools/fullsize_parity.py gemma4 /tmp/e2b $DIMS 2>&1 | grep -v "Writing\|deprecated\|output = func" \
    | tee "$OUT/e2b_fullsize.log" || rc=1
  timeout 110 $PY -m minikv repro scale-wipe --model /tmp/e2b --device $DEVICE --max-num-seqs 4 --requests 8 \
    --formats int8_per_token_head --skip-extras --damage attention 2>&1 | tee -a "$OUT/e2b_fullsize.log" || rc=1
  rm -rf /tmp/e2b
  wait
  cat "$OUT/flan_t5_base_fullsize.log"
  return $rc
}

tokens() {
  # token ids of every shipped model x format x placement x backend on CUDA, greedy, into $OUT/tokens_cuda.json:
  # the GPU side of the "tokens unchanged" check (compare two runs' files)
  timeout ${TOKENS_TIMEOUT:-260} $PY - "$OUT/tokens_cuda.json" <<'PY'
import json, sys, time
import minikv
out, start = {}, time.time()
for model in ("tiny-gemma4", "tiny-t5"):
    task = minikv.tasks.for_model(model)
    prompts = task.prompts(n=8, seed=123)
    for fmt in ("auto", "fp8", "int8_per_token_head", "fp8_per_token_head"):
        for placement in (("row", "block") if fmt.endswith("per_token_head") else ("row",)):
            for backend in ("torch", "triton"):
                llm = minikv.LLM(model=model, kv_cache_dtype=fmt, backend=backend, max_num_seqs=4, seed=0,
                                 device="cuda", kv_scale_placement=placement)
                outs = llm.generate(prompts, minikv.SamplingParams(temperature=0, max_tokens=10 if model == "tiny-gemma4" else 44),
                                    use_tqdm=False)
                key = f"{model}/{fmt}/{placement}/{backend}"
                out[key] = {"prompts": prompts, "ids": [o.token_ids for o in outs],
                            "right": sum(task.check(p, o.text) for p, o in zip(prompts, outs))}
                print(f"{key} {out[key]['right']}/8 right ({time.time() - start:.0f} s)", flush=True)
                with open(sys.argv[1], "w") as f:      # after every run: a time limit keeps what finished
                    json.dump(out, f, indent=1)
PY
}

for step in "$@"; do
  echo "== $step"
  "$step" 2>&1 | tee "$OUT/$step.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "== $step failed (exit $rc)"; status=1; }
done
echo "tools/gpu.sh $*: exit status $status"
exit $status
