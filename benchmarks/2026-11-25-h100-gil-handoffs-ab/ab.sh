# A/B on one warm machine: interactive_probe with the working tree (new) and .ab/*_before.py (old), interleaved
source scripts/device_env.sh
cp arrcoc/preprocess.py .ab/preprocess_after.py; cp arrcoc/pipeline.py .ab/pipeline_after.py
for v in after before after before; do
  cp .ab/preprocess_$v.py arrcoc/preprocess.py; cp .ab/pipeline_$v.py arrcoc/pipeline.py
  timeout 200 $PY scripts/interactive_probe.py --device cuda --clients 32 --max-batch 16 --requests 8192 --json $OUT/ip-$v-$SECONDS.json 2>&1 | grep "^==" | grep -v parity | sed "s/^/$v /" | cut -c1-300
done
cp .ab/preprocess_after.py arrcoc/preprocess.py; cp .ab/pipeline_after.py arrcoc/pipeline.py
