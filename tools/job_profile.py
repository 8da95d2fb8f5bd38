"""Where an in-process batch job's threads spend their time: a sampling profile of every thread.

Runs one 800x600 JPEG job (as bench e2e makes them) in an InProcessExecutor and samples every
thread's stack each millisecond with sys._current_frames(); prints, per thread role, the functions
most often on top (self time) and on the stack (total time). A tool for finding the next limit,
not a benchmark: the sampling itself costs the job some speed.

    python tools/job_profile.py --items 8192 --overlays none --device cuda --backend compiled
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import threading
import time


def sample(stop: threading.Event, counts: dict, period: float = 0.001) -> None:
    me = threading.get_ident()
    while not stop.is_set():
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            role = re.sub(r"[-_]\d+(_\d+)?$", "", names.get(ident, "?"))
            stack = []
            while frame is not None and len(stack) < 40:
                code = frame.f_code
                stack.append(f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_name}")
                frame = frame.f_back
            c = counts.setdefault(
                role, {"n": 0, "self": collections.Counter(), "total": collections.Counter()}
            )
            c["n"] += 1
            c["self"][stack[0]] += 1
            for f in set(stack):
                c["total"][f] += 1
        time.sleep(period)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=8192)
    ap.add_argument("--overlays", default="none")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="compiled")
    ap.add_argument("--top", type=int, default=18)
    args = ap.parse_args()
    import tempfile
    from pathlib import Path

    from arrcoc.bench.e2e import _zip, workload
    from arrcoc.service.client.inprocess import InProcessExecutor
    from arrcoc.settings import default_settings

    root = Path(tempfile.mkdtemp())
    s = default_settings(
        engine={"device": args.device, "backend": args.backend, "backends": (args.backend,)},
        service={"data_dir": root},
        limits={
            "max_batch_items": args.items,
            "max_archive_entries": args.items + 16,
            "max_unpacked_bytes": 8 << 30,
            "max_archive_bytes": 8 << 30,
            "max_owner_bytes": 0,
            "max_data_bytes": 0,
        },
    )
    ex = InProcessExecutor(s)
    ex.warmup()
    archive = _zip(workload()["jpeg_800x600"], args.items, ".jpg")
    for _ in range(2):  # the first job warms what a job touches; the second is sampled
        counts: dict = {}
        stop = threading.Event()
        t = threading.Thread(target=sample, args=(stop, counts), daemon=True)
        t.start()
        t0 = time.perf_counter()
        job = ex.submit_batch(archive, "the red one", overlays=args.overlays)
        while not ex.status(job).state.finished:
            time.sleep(0.002)
        wall = time.perf_counter() - t0
        stop.set()
        t.join()
    print(f"{args.items} items, overlays {args.overlays}: {args.items / wall:.1f} images/s ({wall:.2f} s)")
    for role, c in sorted(counts.items(), key=lambda kv: -kv[1]["n"]):
        if c["n"] < 20:
            continue
        print(f"\n== {role}: {c['n']} samples")
        print("  self:", ", ".join(f"{f} {n / c['n']:.0%}" for f, n in c["self"].most_common(args.top)))
        print("  total:", ", ".join(f"{f} {n / c['n']:.0%}" for f, n in c["total"].most_common(args.top)))
    ex.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
