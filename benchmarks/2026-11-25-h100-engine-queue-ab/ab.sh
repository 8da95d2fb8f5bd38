#!/usr/bin/env bash
# Same machine, one warm engine, interleaved, three rounds each:
# 1. an in-process batch job of 2,048 800x600 JPEGs (scripts/batch_probe.py, the part writer in a
#    child process as on a GPU by default): one engine-host call submitted at a time (if1: the
#    engine thread waits while the job's thread hands the step to the writer and reads on) against
#    two submitted, one running (the next queued behind it: this tree's default);
# 2. in-process interactive, 1 and 32 callers (scripts/interactive_probe.py, batches of 16): OLD
#    (b6ac0a4, its arrcoc/ and scripts/ carried in .abold/) against this tree (a batch's JPEG bytes
#    in one buffer: one copy and two torch calls a batch instead of one of each per image).
set -uo pipefail
source scripts/device_env.sh
OLD=${OLD:-$PWD/.abold}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
$PY -c "import sys, torch, torchvision; print(sys.version.split()[0], torch.__version__, torchvision.__version__)"
C="gpu-jpeg-process-writer-if1 gpu-jpeg-process-writer"
$PY scripts/batch_probe.py --device cuda --items 2048 --configs $C $C $C --json $OUT/batch-probe.json \
  2>&1 | grep -vE "Warning|warn\(" | tee $OUT/batch-probe.log | grep -E "images/s|warm"
for round in 1 2 3; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$OLD
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH $PY scripts/interactive_probe.py --device cuda --clients 1 32 --max-batch 16 \
      --requests 8192 --json $OUT/ip-$side-$round.json > $OUT/ip-$side-$round.log 2>&1)
    $PY -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], [(x['clients'], x['req_s'], x.get('p99_ms')) for x in r if 'req_s' in x], r[-1].get('timings_ms_mean'))" $OUT/ip-$side-$round.json "$side $round"
  done
done
