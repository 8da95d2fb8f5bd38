#!/usr/bin/env bash
# Issue 12, eighth session. (1) The in-process batch job (2,048 800x600 JPEGs, scripts/batch_probe.py,
# part writer in a child) with one step handed to the engine host at a time (q1: as at f0f49cc)
# against two (this tree, STEPS_QUEUED = 2: the next queued behind the running one), interleaved,
# three rounds, one warm engine. (2) Where the in-process interactive path's time goes, 32 callers,
# batches of 16 (scripts/interactive_probe.py): py-spy over every thread's wall (--idle) and over the
# GIL's holders (--gil), summarised by thread role (scripts/spy_summary.py).
set -uo pipefail
source scripts/device_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
$PY -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
Q1=gpu-jpeg-process-writer-q1; Q2=gpu-jpeg-process-writer
$PY scripts/batch_probe.py --device cuda --items 2048 --configs $Q1 $Q2 $Q1 $Q2 $Q1 $Q2 $Q1 $Q2 \
  --json $OUT/batch-probe.json 2>&1 | grep -E "images/s|warm" | tee $OUT/batch-probe.log
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/py_spy-*.whl
for mode in idle gil; do
  /tmp/pyspy/bin/py-spy record --$mode -r 250 --format raw -o /tmp/spy-$mode.txt -- $PY scripts/interactive_probe.py \
    --device cuda --clients 32 --max-batch 16 --requests 16384 2>&1 | grep -E "^==" | cut -c1-400 | tee $OUT/interactive-$mode.log
  $PY scripts/spy_summary.py /tmp/spy-$mode.txt --top 90 > $OUT/spy-interactive-$mode-summary.txt
done
head -8 $OUT/spy-interactive-idle-summary.txt
