#!/usr/bin/env bash
# The aot / start-up run of issue 15 on the GPU machine, in one call (about 4 minutes):
#   1. arrcoc compile --backend aot: a cold AOTInductor build of every program, timed, into C
#   2. arrcoc bench: eager vs compiled (+graphs, cold compile) vs aot (+graphs, packages from 1)
#   3. warm start of compiled and aot, each in a new process, on the caches 1 and 2 filled
# Carries only .whl (pydantic-settings and its needs); no onnxruntime-gpu (five more calls).
# ARRCOC_COMMIT names the commit under test (the device copy has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/artifacts}"
mkdir -p "$OUT"
source scripts/device_env.sh
V="${VARIANT:-arrcoc-texture}"; C=/tmp/arrcoc-aot-run; B="1 2 4 8 16 32 64"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
$PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
t0=$(date +%s)
timeout "${BUILD_S:-110}" $PY -m arrcoc compile --backend aot --variant "$V" --device cuda --buckets $B \
  --cache-dir "$C/aot" 2>&1 | tee "$OUT/compile.log" | grep -E "^\{|built|rror"
echo "cold aot build (new process, wall): $(( $(date +%s) - t0 )) s"
backends="eager compiled"; [ "$(ls $C/aot/aot/*.pt2 2>/dev/null | wc -l)" -ge 2 ] && backends="eager compiled aot"
timeout "${BENCH_S:-85}" $PY -m arrcoc bench --variants "$V" --backends $backends --iters "${ITERS:-30}" \
  --warmup-iters 5 --cache-dir "$C" --out "$OUT" --name "bench-$V-aot" 2>&1 \
  | tee "$OUT/bench.log" | grep -E "^\||rror"
for be in compiled aot; do
  [ -d "$C/$be" ] || continue
  timeout 40 $PY -m arrcoc.bench.startup --variant "$V" --backend $be --device cuda --cache-dir "$C/$be" \
    --buckets $B 2>/dev/null | tail -1 | sed "s/^/warm start $be: /" | tee -a "$OUT/warm.log"
done
