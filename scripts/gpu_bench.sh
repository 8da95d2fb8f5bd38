#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md, one stage per device call (each call must end inside 10 minutes).
# Every file name carries the GPU it ran on (e.g. h200, from nvidia-smi).
#
#   scripts/gpu_bench.sh check              versions, ORT providers, smoke parity
#   scripts/gpu_bench.sh bench VARIANT...   the engine table (eager, compiled, onnx; every bucket) -> $OUT
#   scripts/gpu_bench.sh aot VARIANT...     aot beside eager and compiled, and aot's cold/warm start -> $OUT
#   scripts/gpu_bench.sh startup VARIANT... cold/warm start of compiled and onnx -> $OUT
#   scripts/gpu_bench.sh extra              bfloat16 CLIP (eager, compiled) and its compiled start-up
#   scripts/gpu_bench.sh e2e [ARGS...]      arrcoc bench e2e, in-process and through Celery (.whl,
#                                           .redis, the query encoder in /tmp/mlm.part) -> $OUT, named
#                                           e2e-DATE-GPU-compiled-COMMIT[-inprocess|-celery] (.json .md .png .log)
#
# Carried packages (onnxruntime-gpu chunks, wheels): see scripts/device_env.sh.
# ARRCOC_COMMIT names the commit under test (the device copy has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/artifacts}"
mkdir -p "$OUT"
source scripts/device_env.sh
stage="${1:-check}"; shift || true
VARIANTS=("${@:-arrcoc-texture arrcoc-clip-b16}")  # CLIP: random weights of the real shapes (no hub)
# the GPU's short name for file names: "NVIDIA H200" -> h200, "NVIDIA H100 80GB HBM3" -> h100
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -n "$GPU" ] || GPU=$($PY -c "import torch; print(torch.cuda.get_device_name(0))" 2>/dev/null)
GPU=$(echo "${GPU:-gpu}" | sed -E 's/^(NVIDIA|Tesla) +//I; s/^(GeForce|Quadro) +//I; s/^RTX +/rtx/I' | awk '{print tolower($1)}' | tr -cd 'a-z0-9-')
GPU="${GPU:-gpu}"; DAY=$(date -u +%F)
case "$stage" in
  check)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    $PY - <<'EOF'
import torch, triton, onnx, onnxruntime as ort
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__,
      "onnx", onnx.__version__, "ort", ort.__version__, ort.get_available_providers())
print(torch.cuda.get_device_name(0))
EOF
    $PY -m arrcoc bench --variants arrcoc-texture --backends eager onnx --iters 5 --warmup-iters 2 --out "$OUT" --name check-texture \
      --cache-dir /tmp/arrcoc-check 2>&1 | tee "$OUT/check.log" | grep -vE "Warning|warn\(|torchvision"
    ;;
  bench)
    for v in ${VARIANTS[@]}; do
      $PY -m arrcoc bench --variants "$v" --iters 200 --warmup-iters 20 --out "$OUT" --name "bench-$v-$GPU-$DAY" \
        2>&1 | tee "$OUT/bench-$v-$GPU.log" | grep -vE "Warning|warn\(|torchvision"
    done
    ;;
  aot)  # aot packages built cold (timed) then served: start-up in new processes, speed and parity
    for v in ${VARIANTS[@]}; do
      $PY -m arrcoc bench --startup-only --variants "$v" --backends aot --out "$OUT" --name "startup-$v-aot-$GPU-$DAY" \
        2>&1 | tee "$OUT/startup-$v-aot.log" | grep -E "^\||rror"
      $PY -m arrcoc bench --variants "$v" --backends eager compiled aot --iters 100 --warmup-iters 10 --out "$OUT" \
        --name "bench-$v-aot-$GPU-$DAY" 2>&1 | tee "$OUT/bench-$v-aot.log" | grep -E "^\||rror"
    done
    ;;
  startup)
    $PY -m arrcoc bench --startup-only --variants ${VARIANTS[@]} --backends compiled onnx --out "$OUT" \
      --name "startup-$GPU-$DAY" 2>&1 | tee "$OUT/startup.log" | grep -vE "Warning|warn\(|torchvision"
    ;;
  extra)  # bfloat16 CLIP (eager vs compiled) and the compiled CLIP's cold/warm start: no ORT needed
    $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled --dtype bfloat16 --iters 100 \
      --warmup-iters 10 --out "$OUT" --name "bench-clip-b16-bf16-$GPU-$DAY" 2>&1 | tee "$OUT/bf16.log" | grep -E "^\||rror"
    $PY -m arrcoc bench --startup-only --variants arrcoc-clip-b16 --backends compiled --out "$OUT" \
      --name "startup-clip-$GPU-$DAY" 2>&1 | grep -E "^\||rror"
    ;;
  e2e)  # extra arguments go to arrcoc bench e2e, e.g. --no-celery
    # a watchdog: if the run is still going after E2E_DUMP_AFTER s (a stall), py-spy (carried in
    # .pyspy/) dumps every arrcoc process's threads, with native frames, into $OUT/stall-dump.txt
    if ls .pyspy/py_spy-*.whl >/dev/null 2>&1; then
      [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/py_spy-*.whl
      ( sleep "${E2E_DUMP_AFTER:-420}"
        for pid in $(pgrep -f "arrcoc|celery"); do
          echo "=== $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-200)"
          timeout 20 /tmp/pyspy/bin/py-spy dump --native --pid "$pid" 2>&1
        done > "$OUT/stall-dump.txt"; nvidia-smi >> "$OUT/stall-dump.txt" ) &
      watchdog=$!
    fi
    # a run of one half says so in its file names (a later --name replaces the whole name)
    half=""
    case " $* " in
      *" --no-celery "*) half="-inprocess" ;;
      *" --no-inprocess "*) half="-celery" ;;
    esac
    $PY -m arrcoc bench e2e --device cuda --backend compiled --out "$OUT" \
      --name "e2e-$DAY-$GPU-compiled-${ARRCOC_COMMIT:-unknown}$half" "$@" 2>&1 | tee "$OUT/e2e$half.log" | grep -vE "Warning|warn\("
    [ -n "${watchdog:-}" ] && kill "$watchdog" 2>/dev/null
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
