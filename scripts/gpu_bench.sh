#!/usr/bin/env bash
# Everything a GPU-machine run needs, one stage per call (each call must end inside 10 minutes).
#
#   scripts/gpu_bench.sh check              versions, ORT providers, smoke parity on every bucket
#   scripts/gpu_bench.sh bench VARIANT...   the benchmark (all backends, all buckets) -> $OUT
#   scripts/gpu_bench.sh startup VARIANT... cold/warm start of compiled and onnx -> $OUT
#
# onnxruntime-gpu comes from ../shared/tools/ort-gpu-chunks: five carried chunks leave
# /tmp/ort.part on the warm machine; this script installs it (once) into /tmp/ortsite.
# ARRCOC_COMMIT names the commit under test (the device copy has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/artifacts}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
export TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-16}"
WHEEL=onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
if [ -f /tmp/ort.part ] && [ ! -d /tmp/ortsite/onnxruntime ]; then
  cp /tmp/ort.part "/tmp/$WHEEL" && python3 -m pip install -q --no-index --no-deps --target /tmp/ortsite "/tmp/$WHEEL"
fi
[ -d /tmp/ortsite/onnxruntime ] && export PYTHONPATH="/tmp/ortsite:$PYTHONPATH"
# pydantic-settings and tqdm may be missing there; carried wheels in .whl/ fill the gap
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
[ -d /tmp/site ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
PY="${PY:-python3}"
stage="${1:-check}"; shift || true
VARIANTS=("${@:-arrcoc-texture arrcoc-vit-b16}")
case "$stage" in
  check)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
    $PY - <<'EOF'
import torch, triton, onnx, onnxruntime as ort
print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__,
      "onnx", onnx.__version__, "ort", ort.__version__, ort.get_available_providers())
print(torch.cuda.get_device_name(0))
EOF
    $PY -m arrcoc.bench --variants arrcoc-texture --backends eager onnx --iters 5 --warmup-iters 2 --out "$OUT" --name check-texture \
      --cache-dir /tmp/arrcoc-check 2>&1 | tee "$OUT/check.log" | grep -vE "Warning|warn\(|torchvision"
    ;;
  bench)
    for v in ${VARIANTS[@]}; do
      $PY -m arrcoc.bench --variants "$v" --iters 200 --warmup-iters 20 --out "$OUT" --name "bench-$v" \
        2>&1 | tee "$OUT/bench-$v.log" | grep -vE "Warning|warn\(|torchvision"
    done
    ;;
  startup)
    $PY -m arrcoc.bench --startup-only --variants ${VARIANTS[@]} --backends compiled onnx --out "$OUT" \
      --name startup 2>&1 | tee "$OUT/startup.log" | grep -vE "Warning|warn\(|torchvision"
    ;;
  extra)  # bfloat16 ViT (eager vs compiled) and the compiled ViT's cold/warm start: no ORT needed
    $PY -m arrcoc.bench --variants arrcoc-vit-b16 --backends eager compiled --dtype bfloat16 --iters 100 \
      --warmup-iters 10 --out "$OUT" --name bench-vit-b16-bf16 2>&1 | tee "$OUT/bf16.log" | grep -E "^\||rror"
    $PY -m arrcoc.bench --startup-only --variants arrcoc-vit-b16 --backends compiled --out "$OUT" \
      --name startup-vit 2>&1 | grep -E "^\||rror"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
