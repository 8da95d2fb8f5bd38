#!/usr/bin/env bash
# Same machine, interleaved, three rounds: in-process, 1 and 32 callers (scripts/interactive_probe.py,
# batches of 16): the interactive batcher's two threads (OLD: a0c0309, its arrcoc/ and scripts/ carried
# in .abold/) against one thread that starts a batch on the device, gathers the next, hands the first out
# and decodes the next (NEW: this tree); then the GPU tests of the engine and the decoder on this tree.
# Writes the faster side at 32 callers (mean req/s) to /tmp/ab-winner for the call after it.
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
    $PY -c "import json,sys; r=json.load(open(sys.argv[1]))[-1]; print('   ', r['timings_ms_mean'], r['batch_sizes'])" $OUT/ip-$side-$round.json
  done
done
$PY - "$OUT" <<'PY' | tee /tmp/ab-summary.txt
import json, sys, statistics as st
out = {s: [json.load(open(f"{sys.argv[1]}/ip-{s}-{r}.json"))[-1]["req_s"] for r in (1, 2, 3)] for s in ("old", "new")}
mean = {s: st.mean(v) for s, v in out.items()}
print("32 callers:", out, "mean", {s: round(m, 1) for s, m in mean.items()})
open("/tmp/ab-winner", "w").write("new" if mean["new"] > mean["old"] else "old")
PY
echo "winner: $(cat /tmp/ab-winner)"
$PY -m pytest -q -m gpu tests/test_engine.py tests/test_decode.py -p no:cacheprovider 2>&1 | tail -3
