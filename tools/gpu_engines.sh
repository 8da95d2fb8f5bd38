#!/usr/bin/env bash
# Engine probes on the GPU machine (ONNX Runtime's profile, settings and fusions), one stage per
# device call (each ends inside 10 min). The figures of record come from scripts/gpu_bench.sh.
#
#   tools/gpu_engines.sh ort    ONNX Runtime beside compiled: arrcoc-texture every bucket, ORT's
#                                 op profile at batch 1 and 64; arrcoc-clip-b16 float32 (eager,
#                                 compiled, onnx) and bfloat16 (eager, compiled), ORT profile at 1
#   tools/gpu_engines.sh ortopt ONNX Runtime settings for arrcoc-clip-b16 (tools/ort_options.py:
#                                 parity and speed per CUDA-provider option / disabled rewrite),
#                                 then arrcoc bench eager / compiled / onnx under the best one
#   tools/gpu_engines.sh ortfuse ORT's transformer fusions of the export (engine/ort_fusion.py,
#                                 default for arrcoc-clip-*), within 300 s: arrcoc bench eager /
#                                 compiled / fused onnx at 1 8 64 (parity per bucket); the same
#                                 exports unfused, fused without attention and fused with
#                                 memory-efficient fp32 attention (ort_options.py, parity + p50);
#                                 CUDA kernels a call, fused against unfused (kernel_split.py)
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
    step 40 ortprof-texture-b1 $PY tools/ort_profile.py --device cuda --batch 1 --runs 50 --top 15
    step 40 ortprof-texture-b64 $PY tools/ort_profile.py --device cuda --batch 64 --runs 20 --top 15
    step 150 clip-fp32 $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled onnx \
      --buckets 1 8 64 --iters 100 --warmup-iters 10 --out "$W" --name bench-clip-b16-float32
    step 100 clip-bf16 $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled \
      --dtype bfloat16 --buckets 1 8 64 --iters 100 --warmup-iters 10 --out "$W" --name bench-clip-b16-bfloat16
    step 45 ortprof-clip-b1 $PY tools/ort_profile.py --variant arrcoc-clip-b16 --weights none --device cuda \
      --batch 1 --runs 50 --top 15
    ;;
  ortopt)
    $PY -c "import torch, onnxruntime as o; print('torch', torch.__version__, 'ort', o.__version__, o.get_available_providers())"
    step 330 ortopt $PY tools/ort_options.py --variant arrcoc-clip-b16 --buckets 1 8 64 --json "$W/ort-options.json"
    grep -E "^(compiled|BEST)" "$W/ortopt.log"
    best=$(grep '^BEST_OPTIONS ' "$W/ortopt.log" | cut -d' ' -f2-); bestenv=$(grep '^BEST_ENV' "$W/ortopt.log" | cut -s -d' ' -f2-)
    if [ -n "$best" ]; then
      step 200 clip-fp32 env $bestenv $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled onnx \
        --buckets 1 8 64 --iters 100 --warmup-iters 10 --onnx-options "$best" --out "$W" --name bench-clip-b16-float32
    else
      echo "== no ORT setting kept parity at every bucket: bench skipped"
    fi
    ;;
  ortfuse)  # one cache dir: the later steps reuse the bench's exports (and fused files)
    C=/tmp/arrcoc-ortfuse; rm -rf "$C"
    $PY -c "import torch, onnxscript, onnxruntime as o; print('torch', torch.__version__, 'onnxscript', onnxscript.__version__, 'ort', o.__version__, o.get_available_providers())"
    step 170 clip-fused $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled onnx \
      --buckets 1 8 64 --iters 100 --warmup-iters 10 --cache-dir "$C" --out "$W" --name bench-clip-b16-ortfuse
    $PY -c "import json, sys; [print('   fused', w['backend'], w.get('fusions'), w.get('fuse_s'), w.get('fused')) for w in json.load(open(sys.argv[1]))['warmup'] if w['backend'] == 'onnx']" \
      "$W/bench-clip-b16-ortfuse.json" 2>&1 | cut -c1-400
    step 80 configs $PY tools/ort_options.py --variant arrcoc-clip-b16 --buckets 1 8 64 --no-compiled --iters 50 \
      --configs default unfused fused-mea fused-norm --cache-dir "$C/onnx" --json "$W/ort-fusions.json"
    grep -E "^(default|unfused|fused)" "$W/configs.log" | cut -c1-220
    step 45 kernels $PY tools/kernel_split.py --variant arrcoc-clip-b16 --buckets 1 8 --backends onnx \
      --onnx-fusions none all --cache-dir "$C/onnx" --json "$W/kernel-split-ortfuse.json"
    grep '^{' "$W/kernels.log" | cut -c1-330
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
tar czf "$OUT/engines-$stage.tgz" -C "$W" .
