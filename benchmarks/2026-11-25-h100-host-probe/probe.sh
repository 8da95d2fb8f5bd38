#!/usr/bin/env bash
# Where the host's CPU goes in the interactive phases (scripts/host_cpu.py), the GIL's time
# in-process (py-spy --gil), and the in-process GIL switch interval A/B. Run from the repo root on
# the GPU machine: probe.sh inprocess | celery [E2E ARGS...]
set -uo pipefail
source scripts/device_env.sh
SPYW=$(ls .pyspy/py_spy-*.whl 2>/dev/null | head -1)
[ -n "$SPYW" ] && [ ! -x /tmp/pyspy/bin/py-spy ] && python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy "$SPYW"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; lscpu | grep -E "Model name|Thread|MHz" | head -4
stage=$1; shift
case "$stage" in
  inprocess)
    $PY scripts/interactive_probe.py --device cuda --clients 32 --max-batch 16 --switch-interval-ms 5 0.5 5 0.5 \
      --requests 8192 --json $OUT/ip-switch.json > $OUT/ip-switch.log 2>&1; grep "^==" $OUT/ip-switch.log | cut -c1-200
    $PY scripts/interactive_probe.py --device cuda --clients 32 --max-batch 16 --requests 16384 > $OUT/ip-cpu.log 2>&1 &
    $PY scripts/host_cpu.py --after $OUT/ip-cpu.log "== parity" --wait 2 --window 3 --json $OUT/ip-hostcpu.json | tee $OUT/ip-hostcpu.txt
    wait; grep "^==" $OUT/ip-cpu.log | cut -c1-200
    /tmp/pyspy/bin/py-spy record --gil -r 100 --format raw -o $OUT/spy-ip.txt -- $PY scripts/interactive_probe.py --device cuda \
      --clients 32 --max-batch 16 --requests 8192 > $OUT/ip-spy.log 2>&1; grep "^==" $OUT/ip-spy.log | cut -c1-200
    $PY scripts/spy_summary.py $OUT/spy-ip.txt --top 45 > $OUT/spy-ip-summary.txt; head -60 $OUT/spy-ip-summary.txt; rm -f $OUT/spy-ip.txt
    ;;
  celery)  # each remaining argument: one e2e run's extra flags, quoted
    i=0
    for extra in "$@"; do
      i=$((i+1))
      $PY -m arrcoc bench e2e --device cuda --backend compiled --items 64 --large-items 0 --png-items 0 --requests 8192 \
        $extra --out $OUT --name e2e-$i > $OUT/e2e-$i.log 2>&1 &
      $PY scripts/host_cpu.py --after $OUT/e2e-$i.log "interactive through Celery: 32" --busy "engine processes" --wait 1 --window 3 \
        --json $OUT/celery-hostcpu-$i.json > $OUT/celery-hostcpu-$i.txt
      wait; echo "== run $i: $extra"; cat $OUT/celery-hostcpu-$i.txt | head -30
      grep -E "^\| (inprocess|celery) \| (1|32) " $OUT/e2e-$i.md; rm -f $OUT/e2e-$i.png
    done
    ;;
esac
# everything in one archive (a call brings back 8 files at most)
(cd $OUT && tar czf /tmp/$stage.tgz --exclude='*.tgz' . && rm -f ./* && mv /tmp/$stage.tgz .)
