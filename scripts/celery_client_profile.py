"""Where a Celery client's CPU goes per interactive request: `CeleryExecutor.infer` under cProfile
(this thread's CPU time), against a real redis-server and `arrcoc worker` started here.

    python scripts/celery_client_profile.py [--requests 200] [--device cpu] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arrcoc.bench.e2e import workload  # noqa: E402
from arrcoc.bench.processes import RedisServer, Worker, worker_env  # noqa: E402
from arrcoc.service.client.celery_executor import CeleryExecutor  # noqa: E402
from arrcoc.settings import default_settings  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="eager")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="celery-client-profile-"))
    redis = RedisServer(root / "redis")
    worker = Worker(worker_env(redis.url, root / "data", device=args.device, backend=args.backend,
                               backends=args.backend, worker_processes="1"), root / "worker.log")  # fmt: skip
    try:
        worker.ready(600)
        ex = CeleryExecutor(default_settings(broker_url=redis.url, data_dir=root / "data"))
        image = workload()["jpeg_800x600"][1]
        for _ in range(10):  # warm: connections, the worker's caches
            ex.infer(image, "the red mug")
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(args.requests):
            ex.infer(image, "the red mug")
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(f"unprofiled: {wall * 1e3 / args.requests:.1f} ms a request, client CPU {cpu * 1e3 / args.requests:.2f} ms")
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        for _ in range(args.requests):
            ex.infer(image, "the red mug")
        prof.disable()
        for key in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
            print(out.getvalue())
        ex.close()
    finally:
        worker.stop()
        redis.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
