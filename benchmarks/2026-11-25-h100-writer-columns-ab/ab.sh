#!/usr/bin/env bash
# Same machine, interleaved, three rounds: an in-process batch job of 2,048 800x600 JPEGs
# (scripts/batch_probe.py, config gpu-jpeg-process-writer: the GPU default, the part writer in a
# child process), OLD (2a228b6, its arrcoc/ and scripts/ carried in .abold/: each step pickled to
# the child as Processed items, ~11 arrays an item) against this tree (the step as columns).
set -uo pipefail
source scripts/device_env.sh
OLD=${OLD:-$PWD/.abold}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
for round in 1 2 3; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$OLD
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH $PY scripts/batch_probe.py --device cuda --items 2048 \
      --configs gpu-jpeg-process-writer gpu-jpeg-process-writer --json $OUT/bp-$side-$round.json 2>&1 \
      | grep -E "images/s" | sed "s/^/$side $round: /")
  done
done
