#!/usr/bin/env bash
# Where the end-to-end CPU goes on the GPU machine, in one device call: tools/interactive_probe.py
# (1 and 32 callers) and the worker group's engine
# process under load, under py-spy when .pyspy/ is carried -> $OUT/probe.tgz. Not a figure of
# record (those come from scripts/gpu_bench.sh).
#
#   tools/gpu_probe.sh
#   PROBE_INTERACTIVE=0, PROBE_SPY_INTERACTIVE=0, PROBE_REQUESTS=N narrow it.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/artifacts}"
mkdir -p "$OUT"
source scripts/device_env.sh
R="$OUT"; OUT=/tmp/probe; rm -rf "$OUT"; mkdir -p "$OUT"; trap 'tar czf "$R/probe.tgz" -C /tmp probe' EXIT
# py-spy (carried in .pyspy/) samples the thread holding the GIL: where one process's time goes
SPY=(); if [ -x /tmp/pyspy/bin/py-spy ] || ls .pyspy/py_spy-*.whl >/dev/null 2>&1; then  # installed by an earlier call, or carried
  [ -x /tmp/pyspy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/py_spy-*.whl
  SPY=(/tmp/pyspy/bin/py-spy record --gil -r 200 --format raw -o); fi
if [ "${PROBE_INTERACTIVE:-1}" = 1 ]; then  # PROBE_INTERACTIVE=0: the Celery part only
  [ "${PROBE_SPY_INTERACTIVE:-1}" = 0 ] && ISPY=() || ISPY=("${SPY[@]}")  # py-spy pauses the process per sample
  ${ISPY[@]:+${ISPY[@]} "$OUT/spy-interactive.txt" --} $PY tools/interactive_probe.py --device cuda --clients 1 32 \
    --max-batch 32 16 8 --requests 4096 --json "$OUT/interactive-probe.json" > "$OUT/interactive-probe.log" 2>&1; echo "interactive_probe exit $?"
  grep -E "^==" "$OUT/interactive-probe.log" | cut -c1-300
  [ -s "$OUT/spy-interactive.txt" ] && $PY tools/spy_summary.py "$OUT/spy-interactive.txt" > "$OUT/spy-interactive-summary.txt"
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
    [ -s "$OUT/$f.txt" ] && $PY tools/spy_summary.py "$OUT/$f.txt" > "$OUT/$f-summary.txt"
  done
fi
wait $e2e; echo "e2e probe exit $?"
grep -E "^\| (inprocess|celery)" "$OUT/e2e-probe.md"
head -40 "$OUT/spy-engine-gil-summary.txt" "$OUT/engine-top.txt" "$OUT/host-top.txt" 2>/dev/null
