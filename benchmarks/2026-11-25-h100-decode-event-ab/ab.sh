#!/usr/bin/env bash
# Same machine, interleaved: in-process, 32 callers, the decode stage handing the engine an event
# (this tree) against a host sync (OLD: the previous commit's arrcoc/ and scripts/, copied there by
# an earlier call), then the GPU tests, then the Celery phase with the host's CPU by role.
set -uo pipefail
source scripts/device_env.sh
OLD=${OLD:-/tmp/old}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
for round in 1 2; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$OLD
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH $PY scripts/interactive_probe.py --device cuda --clients 32 --max-batch 16 \
      --requests 8192 --json $OUT/ip-$side-$round.json > $OUT/ip-$side-$round.log 2>&1)
    echo "$side $round: $(grep -E '^== (max batch|parity)' $OUT/ip-$side-$round.log | cut -c1-160 | tr '\n' ' ')"
  done
done
$PY -m pytest -q -m gpu tests/test_decode.py tests/test_engine.py -k "not aot" -p no:cacheprovider 2>&1 | tail -3
