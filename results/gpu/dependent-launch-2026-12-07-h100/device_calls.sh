# ===== gpu_call.sh
#!/usr/bin/env bash
# temporary driver for this session's device calls (not committed)
set -u
R=$PWD
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$R
if [ "$1" = prof ]; then
  FORMATS="auto fp8_per_token_head" TOP=40 timeout 300 python3 tools/gpu_probes/engine_step_profile.py steps $OUT/prof 2048 > $OUT/prof.txt 2>&1; echo "prof exit $?"
  grep -A45 "decode:" $OUT/prof.txt | cut -c1-150
  timeout 150 python3 -m minikv.bench attention --batches 16 64 --contexts 4096 --csv $OUT/att_b16.csv > $OUT/att_b16.txt 2>&1; echo "att exit $?"
  grep -E "^auto|SDPA" $OUT/att_b16.txt | head
fi
if [ "$1" = occ ]; then
  GRID_FORMATS="auto" timeout 260 python3 tools/gpu_probes/decode_occupancy.py $OUT/occ128b16 128b16 > $OUT/occ128b16.txt 2>&1; echo "occ b16 exit $?"
  grep -v "^ *$" $OUT/occ128b16.txt | cut -c1-130 | tail -30
  G=""; for st in 3 4; do for p in 1 2 4 8; do G="$G,256:32x${st}x0x4x1x$p"; done; done
  GRID=${G#,} GRID_FORMATS="auto int8_per_token_head fp8_per_token_head" timeout 250 python3 tools/gpu_probes/decode_occupancy.py $OUT/occ256 256 > $OUT/occ256.txt 2>&1; echo "occ 256 exit $?"
  grep -v "^ *$" $OUT/occ256.txt | cut -c1-130 | tail -30
fi
if [ "$1" = pdl ]; then
  for v in ${VARIANTS:-0 1 T}; do
    P=0; T=0; [ $v != 0 ] && P=1; [ $v = T ] && T=1
    MINIKV_PDL=$P MINIKV_PDL_TRIGGER=$T timeout ${ENG_T:-170} python3 -m minikv.bench engine --device cuda --kv-cache-dtypes ${FMTS:-auto fp8_per_token_head} --contexts ${CTXS:-2048} --no-extras > $OUT/engine_pdl${v}_$SECONDS.txt 2>&1; echo "engine pdl=$v exit $? at $SECONDS s"
  done
  for f in $OUT/engine_pdl*.txt; do echo "== $f"; grep -E "ctx=" $f | sed -E 's/decode tokens.s \(//; s/prefill.*//' | cut -c1-175; done
  if [ -n "${TESTS:-}" ]; then
    MINIKV_PDL=1 MINIKV_PDL_TRIGGER=1 timeout 200 python3 -m pytest -q -m gpu $TESTS > $OUT/tests_pdl.txt 2>&1; echo "tests exit $?"; tail -3 $OUT/tests_pdl.txt
  fi
fi
# ===== gpu_call2.sh
#!/usr/bin/env bash
# temporary driver for this session's device calls (not committed)
set -u
R=$PWD
ln -sfn $R/minikv/models/weights ab_main/minikv/models/weights; ln -sfn ../kernels ab_main/minikv/kernels
python3 -c "import minikv.kernels" 2>/dev/null || ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1
if [ "$1" = ab ]; then
  for t in ${TREES:-main new}; do
    d=$R; [ $t = main ] && d=$R/ab_main
    (cd $d && PYTHONPATH=$PWD timeout ${ENG_T:-250} python3 -m minikv.bench engine --device cuda --kv-cache-dtypes ${FMTS:-auto fp8 int8_per_token_head fp8_per_token_head} --contexts ${CTXS:-2048 8192} --no-extras > $OUT/engine_${t}_$SECONDS.txt 2>&1; echo "engine $t exit $? at $SECONDS s")
  done
  for f in $OUT/engine_*.txt; do echo "== $f"; head -1 $f | cut -c1-100; grep -E "ctx=" $f | sed -E 's/decode tokens.s \(//; s/prefill.*//; s/replayed//' | cut -c1-150; done
fi
if [ "$1" = tests ]; then
  GPU_TESTS="${GPU_TESTS:-tests/test_kernels_gpu.py tests/test_gpu_graphs.py}" OUT=$OUT/tests timeout ${TEST_T:-300} bash tools/gpu.sh tests > $OUT/gpu_tests.txt 2>&1
  echo "gpu tests exit $?"; grep -E "passed|failed|FAIL|Error|exit status" $OUT/gpu_tests.txt | tail -8
fi
# ===== gpu_call4.sh (first call: as below; second call: the loop over '10 00' and the decode_matmul check skipped)
#!/usr/bin/env bash
# temporary driver (not committed): PLAIN-mode Triton matmuls and L2 weight prefetch, switched by environment
set -u
R=$PWD
cd $R/ab_exp
ln -sfn $R/minikv/models/weights minikv/models/weights; ln -sfn ../kernels minikv/kernels
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
MINIKV_PREFETCH=1 timeout 60 python3 -c "
import torch, torch.nn.functional as F
from minikv.kernels.decode_matmul import decode_matmul, decode_matmul_reference
torch.manual_seed(0)
for n, k in ((2048, 1536), (1536, 2048), (1536, 256), (12288, 1536)):
    x = torch.randn(64, k, device='cuda', dtype=torch.bfloat16); w = torch.randn(n, k, device='cuda', dtype=torch.bfloat16) / k ** 0.5
    u = torch.randn_like(w)
    print(n, k, 'plain', (decode_matmul(x, w).float() - decode_matmul_reference(x, w, pair=w)[0].float()).abs().max().item() if False else (decode_matmul(x, w, validate=False).float() - F.linear(x.float(), w.float())).abs().max().item(),
          'gelu_up', (decode_matmul(x, w, up=u).float() - decode_matmul_reference(x, w, up=u).float()).abs().max().item())
" 2>&1 | tail -6
for v in 00 10 11; do
  MINIKV_PLAIN=${v:0:1} MINIKV_PREFETCH=${v:1:1} timeout 70 python3 -m minikv.bench engine --device cuda --kv-cache-dtypes auto --contexts 2048 --no-extras > $OUT/engine_plain${v:0:1}_prefetch${v:1:1}.txt 2>&1; echo "engine $v exit $? at $SECONDS s"
done
for f in $OUT/engine_*.txt; do echo "== $f"; grep -E "ctx=" $f | sed -E 's/decode tokens.s \(//; s/prefill.*//; s/replayed//' | cut -c1-150; done
