#!/usr/bin/env bash
# Same machine, interleaved: in-process, 1 and 32 callers, the GPU-decoded batch resized in the
# batcher's decode stage (OLD: this tree) against in its engine stage (NEW: the change's arrcoc/,
# scripts/ and tests/, copied to /tmp/new by an earlier call); then the change's GPU tests.
set -uo pipefail
source scripts/device_env.sh
NEW=${NEW:-/tmp/new}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
for round in 1 2; do
  for side in old new; do
    dir=$PWD; [ $side = new ] && dir=$NEW
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH $PY scripts/interactive_probe.py --device cuda --clients 1 32 --max-batch 16 \
      --requests 8192 --json $OUT/ip-$side-$round.json > $OUT/ip-$side-$round.log 2>&1)
    echo "$side $round: $(grep -E '^== (max batch|parity)' $OUT/ip-$side-$round.log | cut -c1-130 | tr '\n' ' ')"
  done
done
(cd $NEW && PYTHONPATH=$NEW:$PYTHONPATH $PY -m pytest -q -m gpu tests/test_decode.py -p no:cacheprovider 2>&1 | tail -2)
