#!/usr/bin/env bash
# Where the GIL goes at this tree (issue 12, sixth session): py-spy (carried in .pyspy/) records the
# thread holding the GIL, 200 Hz, over (1) an in-process batch job of 2,048 800x600 JPEGs
# (scripts/batch_probe.py, the default GPU configuration: the part writer in a child process) and
# (2) in-process interactive requests, 32 callers, batches of 16 (scripts/interactive_probe.py);
# scripts/spy_summary.py splits the samples by thread role and function.
set -uo pipefail
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/py_spy-*.whl
SPY=(/tmp/pyspy/bin/py-spy record --gil -r 200 --format raw -o)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
"${SPY[@]}" $OUT/spy-batch.txt -- $PY scripts/batch_probe.py --device cuda --items 2048 \
  --configs gpu-jpeg-process-writer gpu-jpeg-process-writer 2>&1 | grep -E "images/s|warm"
$PY scripts/spy_summary.py $OUT/spy-batch.txt --top 60 > $OUT/spy-batch-summary.txt
"${SPY[@]}" $OUT/spy-interactive.txt -- $PY scripts/interactive_probe.py --device cuda --clients 32 --max-batch 16 \
  --requests 8192 2>&1 | grep -E "^== max"
$PY scripts/spy_summary.py $OUT/spy-interactive.txt --top 60 > $OUT/spy-interactive-summary.txt
head -45 $OUT/spy-batch-summary.txt
