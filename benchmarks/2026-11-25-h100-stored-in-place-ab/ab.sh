#!/usr/bin/env bash
# Issue 12, seventh session. Same machine, interleaved, three rounds: an in-process batch job of
# 2,048 800x600 JPEGs, stored in the zip (scripts/batch_probe.py, config gpu-jpeg-process-writer,
# twice a process), OLD (cc4226a, its arrcoc/ and scripts/ carried in .abold/: every entry copied
# through zipfile into packs; the JPEG header checks through the decoder's pool) against this tree
# (stored entries read in place from the archive; header checks in the calling thread). Then the
# GPU tests, then py-spy (--gil, 200 Hz) over this tree's job: where the GIL goes now.
set -uo pipefail
source scripts/device_env.sh
OLD=${OLD:-$PWD/.abold}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name" | head -1
$PY -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
for round in 1 2 3; do
  for side in old new; do
    dir=$PWD; [ $side = old ] && dir=$OLD
    (cd $dir && PYTHONPATH=$dir:$PYTHONPATH $PY scripts/batch_probe.py --device cuda --items 2048 \
      --configs gpu-jpeg-process-writer gpu-jpeg-process-writer --json $OUT/bp-$side-$round.json 2>&1 \
      | grep -E "images/s" | sed "s/^/$side $round: /")
  done
done
$PY -m pytest -q -m gpu tests/test_decode.py tests/test_engine.py tests/test_service.py -p no:cacheprovider 2>&1 | tail -3
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/py_spy-*.whl
/tmp/pyspy/bin/py-spy record --gil -r 200 --format raw -o $OUT/spy-batch.txt -- $PY scripts/batch_probe.py \
  --device cuda --items 2048 --configs gpu-jpeg-process-writer gpu-jpeg-process-writer 2>&1 | grep -E "images/s"
$PY scripts/spy_summary.py $OUT/spy-batch.txt --top 70 > $OUT/spy-batch-summary.txt
rm -f $OUT/spy-batch.txt
head -12 $OUT/spy-batch-summary.txt
