#!/usr/bin/env bash
# The engine-level GPU runs of issues 14 and 15, one stage per device call (each ends inside 10 min):
#
#   scripts/gpu_engines.sh ort    ONNX Runtime beside compiled: arrcoc-texture every bucket, ORT's
#                                 op profile at batch 1 and 64; arrcoc-clip-b16 float32 (eager,
#                                 compiled, onnx) and bfloat16 (eager, compiled), ORT profile at 1
#   scripts/gpu_engines.sh aot    scripts/gpu_aot.sh with a longer build budget
#
# Needs onnxruntime-gpu assembled in /tmp/ort.part (../shared/tools/ort-gpu-chunks) and .whl
# carried; see scripts/device_env.sh. Everything lands in $OUT/engines-<stage>.tgz (a run brings
# back at most 8 files). ARRCOC_COMMIT names the commit under test (the device copy has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/artifacts}"
mkdir -p "$OUT"
source scripts/device_env.sh
stage="${1:-ort}"
W=/tmp/engines-$stage; rm -rf "$W"; mkdir -p "$W"
step() {  # step SECONDS NAME CMD...: time-boxed, logged to $W/NAME.log, tables to stdout
  local s=$1 n=$2; shift 2
  echo "== $n (budget ${s}s)"; local t0=$(date +%s)
  timeout "$s" "$@" > "$W/$n.log" 2>&1; echo "   exit $? after $(( $(date +%s) - t0 )) s"
  grep -E "^\||^ +[A-Za-z]|ms a run|rror|providers" "$W/$n.log" | grep -v "Warning" | head -60
}
case "$stage" in
  ort)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    $PY -c "import torch, triton, onnx, onnxruntime as o; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'onnx', onnx.__version__, 'ort', o.__version__, o.get_available_providers())"
    step 170 texture $PY -m arrcoc bench --variants arrcoc-texture --backends compiled onnx --iters 200 \
      --warmup-iters 20 --out "$W" --name bench-texture-onnx
    step 40 ortprof-texture-b1 $PY scripts/ort_profile.py --device cuda --batch 1 --runs 50 --top 15
    step 40 ortprof-texture-b64 $PY scripts/ort_profile.py --device cuda --batch 64 --runs 20 --top 15
    step 150 clip-fp32 $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled onnx \
      --buckets 1 8 64 --iters 100 --warmup-iters 10 --out "$W" --name bench-clip-b16-float32
    step 100 clip-bf16 $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled \
      --dtype bfloat16 --buckets 1 8 64 --iters 100 --warmup-iters 10 --out "$W" --name bench-clip-b16-bfloat16
    step 45 ortprof-clip-b1 $PY scripts/ort_profile.py --variant arrcoc-clip-b16 --weights none --device cuda \
      --batch 1 --runs 50 --top 15
    ;;
  aot)
    BUILD_S="${BUILD_S:-330}" OUT="$W" bash scripts/gpu_aot.sh 2>&1 | tee "$W/aot.log"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
tar czf "$OUT/engines-$stage.tgz" -C "$W" .
