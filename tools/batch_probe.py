"""What bounds an in-process batch job (issue 12): the e2e benchmark's 2,048-photo job under
variants of the pipeline, one warm engine, each variant's images/s, CPU cores used (process CPU
time over wall: ~1 means one thread at a time, the GIL) and per-item stages.

    python tools/batch_probe.py [--items 2048] [--configs gpu-jpeg pool-jpeg none ...]

Where the GIL's time goes: run it under `py-spy record --gil` (tools/gpu_probe.sh does).

Variants: how overlays are encoded (nvJPEG on the GPU, or blended on the GPU and encoded by
Pillow in the render pool, or none), how many engine-host calls run at once, how many steps are handed to it and how
many part writes may wait (arrcoc.service.jobs.batch.IN_FLIGHT / STEPS_QUEUED / WRITE_QUEUE) and where (ARRCOC_BATCH_WRITER: a child
process or a thread), the render pool's size.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arrcoc import overlays  # noqa: E402
from arrcoc.bench.e2e import _zip, batch_job, workload  # noqa: E402
from arrcoc.engine import resolve_device  # noqa: E402
from arrcoc.service.client.inprocess import InProcessExecutor  # noqa: E402
from arrcoc.service.jobs import batch  # noqa: E402
from arrcoc.service.jobs import writer as part_writer  # noqa: E402
from arrcoc.service.jobs.parts import write_step  # noqa: E402
from arrcoc.settings import default_settings  # noqa: E402

# name -> overrides of BASE: overlay format, nvJPEG or Pillow, engine calls in flight, steps queued for the writer and where it runs,
# render pool threads, JPEG quality, overlay side (ARRCOC_OVERLAY_MAX_SIDE)
BASE = {"fmt": "jpeg", "gpu_jpeg": True, "in_flight": 1, "queued": 2, "write_queue": 2, "pool": 4, "quality": 90, "side": 1024,
        "writer": "thread"}
CONFIGS = {
    "gpu-jpeg": {},
    "gpu-jpeg-process-writer": {"writer": "process"},
    "none-process-writer": {"fmt": "none", "writer": "process"},
    "gpu-jpeg-wq1": {"write_queue": 1},
    "gpu-jpeg-if2": {"in_flight": 2},
    "gpu-jpeg-process-writer-if2": {"writer": "process", "in_flight": 2},
    "gpu-jpeg-process-writer-q1": {"writer": "process", "queued": 1},  # no step queued behind the running one
    "gpu-jpeg-q1": {"queued": 1},
    "gpu-jpeg-q85": {"quality": 85},
    "gpu-jpeg-q75": {"quality": 75},
    "gpu-jpeg-q80": {"quality": 80},
    "gpu-jpeg-768": {"side": 768},
    "gpu-jpeg-512": {"side": 512},
    "gpu-jpeg-768-q80": {"side": 768, "quality": 80},
    "pool-jpeg-12": {"gpu_jpeg": False, "pool": 12},
    "none": {"fmt": "none"},
    "none-if2": {"fmt": "none", "in_flight": 2},
    "inline-writer": {"writer": "inline"},  # each step written in the job's thread before the next goes on
}


def _inline_submit(self, jd, keys, items, ext):
    """PartWriter.submit writing the step now, in the calling thread (the "inline" writer)."""
    done: Future = Future()
    done.set_result(write_step(jd, list(keys), list(items), ext))
    return part_writer.PendingStep(done, (jd, list(keys), list(items), ext))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, default=2048)
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="compiled")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    device = resolve_device(args.device)
    photos = workload()["jpeg_800x600"]
    archive = _zip(photos, args.items, ".jpg")
    root = Path(tempfile.mkdtemp(prefix="batch-probe-"))

    def settings(fmt: str, name: str, side: int = 1024, quality: int = 90, writer: str = "thread"):
        return default_settings(device=str(device), backend=args.backend, backends=(args.backend,),
                                data_dir=root / name, overlay_format=fmt, broker_url=None,
                                overlay_max_side=side, overlay_jpeg_quality=quality, batch_writer=writer,
                                max_batch_items=max(args.items, 64))  # fmt: skip

    first = InProcessExecutor(settings("jpeg", "warm"))
    t0 = time.perf_counter()
    first.warmup()
    print(f"warm-up {time.perf_counter() - t0:.1f} s", flush=True)
    pipe = first.runtime.pipeline
    submit = part_writer.PartWriter.submit
    rows = []
    for name in args.configs:
        c = BASE | CONFIGS[name]
        overlays.JPEG_ON_GPU = c["gpu_jpeg"]
        batch.IN_FLIGHT, batch.STEPS_QUEUED, batch.WRITE_QUEUE = c["in_flight"], c["queued"], c["write_queue"]
        part_writer.PartWriter.submit = _inline_submit if c["writer"] == "inline" else submit
        writer = "thread" if c["writer"] == "inline" else c["writer"]
        ex = InProcessExecutor(settings(c["fmt"], name, c["side"], c["quality"], writer), pipeline=pipe)
        ex.runtime._render_pool = ThreadPoolExecutor(c["pool"], thread_name_prefix="arrcoc-render")
        batch_job(ex, _zip(photos, 64, ".jpg"), 64, device)  # warm this executor's threads
        cpu0, wall0 = time.process_time(), time.perf_counter()
        row = batch_job(ex, archive, args.items, device)
        row["cores_used"] = round((time.process_time() - cpu0) / (time.perf_counter() - wall0), 2)
        row["config"] = name
        row["settings"] = c
        rows.append(row)
        print(f"{name:18s} {row['images_per_s']:8.1f} images/s  cores {row['cores_used']:.2f}  gpu {row['gpu_busy']}  "
              + json.dumps(row["stage_ms_per_item"]), flush=True)  # fmt: skip
        ex.close()  # the lent engine stays open: the next variant shares it
        ex._jobs.shutdown(wait=True)
    first.close()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
