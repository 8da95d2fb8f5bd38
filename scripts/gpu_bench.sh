#!/usr/bin/env bash
# Everything a GPU-machine run needs, one stage per call (each call must end inside 10 minutes).
#
#   scripts/gpu_bench.sh check              versions, ORT providers, smoke parity on every bucket
#   scripts/gpu_bench.sh bench VARIANT...   the benchmark (all backends, all buckets) -> $OUT
#   scripts/gpu_bench.sh startup VARIANT... cold/warm start of compiled and onnx -> $OUT
#   scripts/gpu_bench.sh batching           dynamic batching on/off through Celery (carried
#                                           .whl celery/redis wheels and .redis server) -> $OUT
#   scripts/gpu_bench.sh probe              where the end-to-end CPU goes: scripts/interactive_probe.py
#                                           (1 and 32 callers) and the worker group's engine
#                                           process, under py-spy if .pyspy/ is carried -> probe.tgz
#   scripts/gpu_bench.sh e2e [ARGS...]      arrcoc bench e2e, in-process and through Celery (.whl,
#                                           .redis, the query encoder in /tmp/mlm.part) -> $OUT
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
      $PY -m arrcoc bench --variants "$v" --iters 200 --warmup-iters 20 --out "$OUT" --name "bench-$v" \
        2>&1 | tee "$OUT/bench-$v.log" | grep -vE "Warning|warn\(|torchvision"
    done
    ;;
  startup)
    $PY -m arrcoc bench --startup-only --variants ${VARIANTS[@]} --backends compiled onnx --out "$OUT" \
      --name startup 2>&1 | tee "$OUT/startup.log" | grep -vE "Warning|warn\(|torchvision"
    ;;
  extra)  # bfloat16 CLIP (eager vs compiled) and the compiled CLIP's cold/warm start: no ORT needed
    $PY -m arrcoc bench --variants arrcoc-clip-b16 --backends eager compiled --dtype bfloat16 --iters 100 \
      --warmup-iters 10 --out "$OUT" --name bench-clip-b16-bf16 2>&1 | tee "$OUT/bf16.log" | grep -E "^\||rror"
    $PY -m arrcoc bench --startup-only --variants arrcoc-clip-b16 --backends compiled --out "$OUT" \
      --name startup-clip 2>&1 | grep -E "^\||rror"
    ;;
  batching)  # extra arguments go to batching_bench.py, e.g. --processes 4
    $PY scripts/batching_bench.py --device cuda --clients 32 --client-processes 8 --max-batch 32 --requests 1024 \
      --rounds 2 --out "$OUT" "$@" \
      2>&1 | tee "$OUT/batching.log" | grep -vE "Warning|warn\("
    ;;
  probe)  # -> $OUT/probe.tgz
    R="$OUT"; OUT=/tmp/probe; rm -rf "$OUT"; mkdir -p "$OUT"; trap 'tar czf "$R/probe.tgz" -C /tmp probe' EXIT
    # py-spy (carried in .pyspy/) samples the thread holding the GIL: where one process's time goes
    SPY=(); if [ -x /tmp/pyspy/bin/py-spy ] || ls .pyspy/py_spy-*.whl >/dev/null 2>&1; then  # installed by an earlier call, or carried
      [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/py_spy-*.whl
      SPY=(/tmp/pyspy/bin/py-spy record --gil -r 200 --format raw -o); fi
    if [ "${PROBE_INTERACTIVE:-1}" = 1 ]; then  # PROBE_INTERACTIVE=0: the Celery part only
      [ "${PROBE_SPY_INTERACTIVE:-1}" = 0 ] && ISPY=() || ISPY=("${SPY[@]}")  # py-spy pauses the process per sample
      ${ISPY[@]:+${ISPY[@]} "$OUT/spy-interactive.txt" --} $PY scripts/interactive_probe.py --device cuda --clients 1 32 \
        --max-batch 32 16 8 --requests 4096 --json "$OUT/interactive-probe.json" > "$OUT/interactive-probe.log" 2>&1; echo "interactive_probe exit $?"
      grep -E "^==" "$OUT/interactive-probe.log" | cut -c1-300
      [ -s "$OUT/spy-interactive.txt" ] && $PY scripts/spy_summary.py "$OUT/spy-interactive.txt" > "$OUT/spy-interactive-summary.txt"
    fi
    # the Celery path: the worker group's engine process and one Celery process, sampled while the
    # 32 clients run (GIL holders, and every thread's state with --idle), with per-thread CPU
    timeout 400 $PY -m arrcoc bench e2e --device cuda --backend compiled --items 256 --large-items 0 --png-items 0 \
      --requests "${PROBE_REQUESTS:-8000}" --out "$OUT" --name e2e-probe > "$OUT/e2e-probe.log" 2>&1 &
    e2e=$!
    for _ in $(seq 380); do grep -q "interactive through Celery: 32" "$OUT/e2e-probe.log" 2>/dev/null && break; sleep 1; done
    # the load has begun when the engine process uses over half a core (the clients start first)
    pid=$(pgrep -f "arrcoc.service.host.engine_process" | head -1)
    ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
    for _ in $(seq 240); do
      [ -n "$pid" ] || break; a=$(ticks "$pid"); sleep 1; b=$(ticks "$pid")
      [ $((b - a)) -gt $(($(getconf CLK_TCK) / 2)) ] && break
    done
    sleep 2; echo "sampling the engine process $pid at ${SECONDS}s: $(grep -c . "$OUT/e2e-probe.log") log lines"
    front=$(pgrep -f "arrcoc worker .*-n .*-1@" | head -1)
    if [ -n "$pid" ] && [ ${#SPY[@]} -gt 0 ]; then
      P=(/tmp/pyspy/bin/py-spy record -r 100 --format raw -d 6)  # --gil needs the blocking mode
      "${P[@]}" --gil -o "$OUT/spy-engine-gil.txt" --pid "$pid" > "$OUT/spy-engine.log" 2>&1 & spies=($!)
      "${P[@]}" --nonblocking --idle -o "$OUT/spy-engine-idle.txt" --pid "$pid" >> "$OUT/spy-engine.log" 2>&1 & spies+=($!)
      [ -n "$front" ] && { "${P[@]}" --gil -o "$OUT/spy-celery-gil.txt" --pid "$front" >> "$OUT/spy-engine.log" 2>&1 & spies+=($!); }
      sleep 1; top -b -H -n 2 -d 2 -p "$pid" | awk '/^top -/{n++} n==2' | head -30 > "$OUT/engine-top.txt"
      top -b -n 2 -d 1 | awk '/^top -/{n++} n==2' | head -40 > "$OUT/host-top.txt"
      ps -o nlwp= -p "$pid" | sed 's/^/engine process threads: /'
      wait "${spies[@]}" 2>/dev/null
      for f in spy-engine-gil spy-engine-idle spy-celery-gil; do
        [ -s "$OUT/$f.txt" ] && $PY scripts/spy_summary.py "$OUT/$f.txt" > "$OUT/$f-summary.txt"
      done
    fi
    wait $e2e; echo "e2e probe exit $?"
    grep -E "^\| (inprocess|celery)" "$OUT/e2e-probe.md"
    head -40 "$OUT/spy-engine-gil-summary.txt" "$OUT/engine-top.txt" "$OUT/host-top.txt" 2>/dev/null
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
    $PY -m arrcoc bench e2e --device cuda --backend compiled --out "$OUT" \
      --name "e2e-$(date -u +%F)-h100-compiled-${ARRCOC_COMMIT:-unknown}" "$@" 2>&1 | tee "$OUT/e2e.log" | grep -vE "Warning|warn\("
    [ -n "${watchdog:-}" ] && kill "$watchdog" 2>/dev/null
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
esac
