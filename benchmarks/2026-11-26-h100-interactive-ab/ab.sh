#!/usr/bin/env bash
# Issue 12, eighth session. Same machine, interleaved: in-process interactive requests, 32 callers,
# batches of 16 (scripts/interactive_probe.py --max-batch 16 16 16: three timed runs a process on
# one warm engine), OLD (fadc890, its arrcoc/ and scripts/ carried in .abold/) against this tree
# (each result built in its caller's thread; the decode stage's requests by constructor; no
# per-call device lookups for the decode stream and the graph's event), two processes a side.
# Then the GPU tests.
set -uo pipefail
source scripts/device_env.sh
OLD=${OLD:-$PWD/.abold}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
for round in 1 2; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$OLD
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH $PY scripts/interactive_probe.py --device cuda --clients 32 \
      --max-batch 16 16 16 --requests 8192 --json $OUT/ip-$side-$round.json 2>&1 \
      | grep -E "^== max" | sed "s/^/$side $round: /")
  done
done
$PY -m pytest -q -m gpu tests/test_decode.py tests/test_engine.py tests/test_service.py -p no:cacheprovider 2>&1 | tail -3
