#!/usr/bin/env bash
# Same machine, interleaved: 32 clients through Celery (8 client processes) against a worker group of
# 8 Celery processes and E engine processes on the GPU, E = 2 (the default) or 3; short e2e runs
# (64-item batch jobs, 8,192 requests at 32 clients). ROUND names the files; ORDER the order of E.
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
for e in ${ORDER:-2 3}; do
  timeout 280 $PY -m arrcoc bench e2e --device cuda --backend compiled --items 64 --large-items 0 --png-items 0 \
    --requests 4096 --engine-processes $e --out $OUT --name e2e-e$e-r${ROUND:-1} > /tmp/e$e.log 2>&1
  rm -f $OUT/e2e-e$e-r${ROUND:-1}.png
  echo "E=$e round ${ROUND:-1}: $(grep -E '^\| (celery|inprocess) \| 32 ' $OUT/e2e-e$e-r${ROUND:-1}.md | tr '\n' ' ')"
done
