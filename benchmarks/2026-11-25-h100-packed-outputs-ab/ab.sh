#!/usr/bin/env bash
# Same machine, interleaved, three rounds: in-process, 1 and 32 callers (scripts/interactive_probe.py,
# batches of 16), the engine stage's outputs brought to the host one by one (OLD: the commit before,
# its arrcoc/ and scripts/ carried in .abold/) against packed inside the CUDA graph and brought over in
# one copy (NEW: this tree); then the GPU tests of the engine and the decoder on this tree.
set -uo pipefail
source scripts/device_env.sh
OLD=${OLD:-$PWD/.abold}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
$PY -c "import sys, torch, torchvision; print(sys.version.split()[0], torch.__version__, torchvision.__version__)"
for round in 1 2 3; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$OLD
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH $PY scripts/interactive_probe.py --device cuda --clients 1 32 --max-batch 16 \
      --requests 8192 --json $OUT/ip-$side-$round.json > $OUT/ip-$side-$round.log 2>&1)
    echo "$side $round: $(grep -E '^== (max batch|parity)' $OUT/ip-$side-$round.log | cut -c1-130 | tr '\n' ' ')"
  done
done
grep -h "decode alone" $OUT/ip-old-1.log $OUT/ip-new-1.log | cut -c1-400
$PY -m pytest -q -m gpu tests/test_engine.py tests/test_decode.py -p no:cacheprovider 2>&1 | tail -3
