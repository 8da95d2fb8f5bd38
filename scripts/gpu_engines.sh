#!/usr/bin/env bash
# The engine-level GPU runs of issues 14 and 15, one stage per device call (each ends inside 10 min):
#
#   scripts/gpu_engines.sh ort    ONNX Runtime beside compiled: arrcoc-texture every bucket, ORT's
#                                 op profile at batch 1 and 64; arrcoc-clip-b16 float32 (eager,
#                                 compiled, onnx) and bfloat16 (eager, compiled), ORT profile at 1
#   scripts/gpu_engines.sh ortopt ONNX Runtime settings for arrcoc-clip-b16 (scripts/ort_options.py:
#                                 parity and speed per CUDA-provider option / disabled rewrite),
#                                 then arrcoc bench eager / compiled / onnx under the best one
#   scripts/gpu_engines.sh ortfuse ORT's transformer fusions of the export (engine/ort_fusion.py,
#                                 default for arrcoc-clip-*), within 300 s: arrcoc bench eager /
#                                 compiled / fused onnx at 1 8 64 (parity per bucket); the same
#                                 exports unfused, fused without attention and fused with
#                                 memory-efficient fp32 attention (ort_options.py, parity + p50);
#                                 CUDA kernels a call, fused against unfused (kernel_split.py)
#   scripts/gpu_engines.sh aot    scripts/gpu_aot.sh with a longer build budget
#   scripts/gpu_engines.sh debug  why aot crashed (issue 15), within 390 s (DEBUG_S): the aot packages
#                                 built (no load) beside a cold compiled start; a warm compiled
#                                 start with --probe (where its warmup_s goes); scripts/aot_debug.py,
#                                 each load / run / capture step in its own process; if the real
#                                 AotBackend with graphs works, arrcoc bench compiled + aot and an
#                                 aot warm start; ORT's profile by cudnn_conv_algo_search if
#                                 onnxruntime-gpu is there (skipped otherwise). Carry .whl only.
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
  ortopt)
    $PY -c "import torch, onnxruntime as o; print('torch', torch.__version__, 'ort', o.__version__, o.get_available_providers())"
    step 330 ortopt $PY scripts/ort_options.py --variant arrcoc-clip-b16 --buckets 1 8 64 --json "$W/ort-options.json"
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
    step 80 configs $PY scripts/ort_options.py --variant arrcoc-clip-b16 --buckets 1 8 64 --no-compiled --iters 50 \
      --configs default unfused fused-mea fused-norm --cache-dir "$C/onnx" --json "$W/ort-fusions.json"
    grep -E "^(default|unfused|fused)" "$W/configs.log" | cut -c1-220
    step 45 kernels $PY scripts/kernel_split.py --variant arrcoc-clip-b16 --buckets 1 8 --backends onnx \
      --onnx-fusions none all --cache-dir "$C/onnx" --json "$W/kernel-split-ortfuse.json"
    grep '^{' "$W/kernels.log" | cut -c1-330
    ;;
  aotbench)  # the aot backend in the report: texture start-up (cold build, warm) in new processes, clip-b16 beside eager/compiled
    step 170 startup-texture-aot $PY -m arrcoc bench --startup-only --variants arrcoc-texture --backends aot \
      --out "$W" --name startup-texture-aot
    step 380 clip-aot $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled aot --buckets 1 8 64 \
      --iters 50 --warmup-iters 5 --out "$W" --name bench-clip-b16-aot
    ;;
  aot)
    BUILD_S="${BUILD_S:-330}" OUT="$W" bash scripts/gpu_aot.sh 2>&1 | tee "$W/aot.log"
    ;;
  debug)
    V=arrcoc-texture; C=/tmp/arrcoc-debug; B="1 2 4 8 16 32 64"; END=${DEBUG_S:-390}  # seconds since the script began
    left() { local l=$((END - SECONDS)); echo $(( l < $1 ? (l > 5 ? l : 5) : $1 )); }  # min(budget, time left)
    rm -rf "$C"; mkdir -p "$C"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    command -v gdb >/dev/null && echo "gdb: yes" || echo "gdb: no (no native backtraces)"
    echo "== aot build (background, budget ${AOT_BUILD_S:-170}s) beside a cold compiled start"
    $PY scripts/aot_debug.py --cache-dir "$C/aot" --build "${AOT_BUILD_S:-170}" --steps --json "$W/aot-build.json" \
      > "$W/aot-build.log" 2>&1 &
    build=$!
    # beside it, a toy model built and loaded with the host wrapper at Inductor's default and at -O0
    mkdir -p "$C/aot/aot"
    $PY scripts/aot_debug.py --cache-dir "$C/aot" --steps tiny_plain tiny_o0 --timeout 150 --budget 300 \
      > "$W/aot-tiny.log" 2>&1 &
    tiny=$!
    if [ -z "${AOT_ONLY:-}" ]; then
      step "$(left 150)" compiled-cold $PY -m arrcoc.bench.startup --variant $V --backend compiled --device cuda \
        --cache-dir "$C/compiled" --buckets $B
    fi
    wait $build; echo "   aot build exit $?"; grep -E "^STEP|^    " "$W/aot-build.log" | cut -c1-300
    wait $tiny; grep -E "^STEP|^native" "$W/aot-tiny.log" | cut -c1-300; grep -B2 -A12 "native backtrace" "$W/aot-tiny.log" | grep -E "parse_device|regex|segv|^ +\|" | head -8 | cut -c1-240
    if [ -z "${AOT_ONLY:-}" ]; then  # on a quiet machine: where the compiled backend's warm start goes
      step "$(left 60)" compiled-warm $PY -m arrcoc.bench.startup --variant $V --backend compiled --device cuda \
        --cache-dir "$C/compiled" --buckets $B --probe
      tail -1 "$W/compiled-warm.log" | cut -c1-1500
    fi
    echo "== aot_debug steps (budget $(left 175)s)"
    timeout "$(( $(left 175) + 10 ))" env ${AOT_DEBUG_ENV:-} $PY scripts/aot_debug.py --cache-dir "$C/aot" --timeout 45 \
      --budget "$(left 175)" --json "$W/aot-debug.json" ${AOT_STEPS:+--steps $AOT_STEPS} 2>&1 \
      | tee "$W/aot-debug.log" | cut -c1-600
    if grep -qE "^STEP backend_graph +OK" "$W/aot-debug.log"; then
      step "$(left 90)" bench $PY -m arrcoc bench --variants $V --backends compiled aot --iters 100 \
        --warmup-iters 10 --cache-dir "$C" --out "$W" --name bench-$V-aot-debug
      step "$(left 45)" aot-warm $PY -m arrcoc.bench.startup --variant $V --backend aot --device cuda \
        --cache-dir "$C/aot" --buckets $B --probe
      tail -1 "$W/aot-warm.log" | cut -c1-1500
    else
      echo "== bench and aot warm start skipped: AotBackend with CUDA graphs did not work (see above)"
    fi
    if $PY -c "import onnxruntime as o, sys; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" \
        2>/dev/null; then
      for run in 1:EXHAUSTIVE 64:EXHAUSTIVE 64:HEURISTIC; do
        b=${run%%:*}; algo=${run##*:}
        [ "$(left 40)" -ge 30 ] || { echo "== ortprof b$b $algo: no time left"; continue; }
        step "$(left 40)" ortprof-b$b-$algo $PY scripts/ort_profile.py --device cuda --batch $b --runs 20 \
          --warmup 2 --top 14 --cudnn-conv-algo-search $algo
      done
    else
      echo "== ORT profiles skipped: no onnxruntime with CUDAExecutionProvider (needs /tmp/ort.part)"
    fi
    echo "debug stage: $SECONDS s"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
tar czf "$OUT/engines-$stage.tgz" -C "$W" .
