# The e2e benchmark's engine-alone timing (arrcoc.bench.e2e.engine_alone) three times in a row after the
# same set-up as `arrcoc bench e2e --device cpu --backend eager --items 256`, with (env) or without (plain)
# collect_env first: `python engine_alone.py env|plain`, from the project root.
import sys, tempfile, time
from arrcoc.bench.e2e import engine_alone, workload, _settings, E2EConfig
from arrcoc.bench.env import collect_env
from arrcoc.engine import resolve_device
from arrcoc.service.client.inprocess import InProcessExecutor
from arrcoc.service.jobs.batch import step_items
from pathlib import Path
mode = sys.argv[1]
cfg = E2EConfig(device="cpu", backend="eager", items=256, large_items=0, png_items=0, requests=16, clients=8, celery=False, rounds=1)
device = resolve_device("cpu")
work = workload()
if mode == "env":
    collect_env(device)
ex = InProcessExecutor(_settings(cfg, Path(tempfile.mkdtemp())))
ex.warmup()
step = step_items(ex.runtime)
for i in range(3):
    print(mode, i, engine_alone(ex.runtime, work["jpeg_800x600"], 256, step)["images_per_s"], flush=True)
ex.close()
