"""What writing a batch job's results costs on this machine: raw write speed of the
data dir's file system, then the batch job's own write stage (part files) and results.zip build,
profiled, for 2,048 real items (one CPU-made step of 64 results written 32 times).

    python tools/io_probe.py [--dirs /tmp /dev/shm]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from arrcoc.bench.e2e import _zip, workload  # noqa: E402
from arrcoc.request import Controls  # noqa: E402
from arrcoc.service.client.inprocess import InProcessExecutor  # noqa: E402
from arrcoc.service.jobs import batch, parts  # noqa: E402
from arrcoc.service.jobs.archive import load_items  # noqa: E402
from arrcoc.service.jobs.results import step_table  # noqa: E402
from arrcoc.service.jobs.results_zip import build_results_zip  # noqa: E402
from arrcoc.settings import OVERLAY_EXTENSIONS, default_settings  # noqa: E402


def raw_write(root: Path, size: int = 72_000, n: int = 2048) -> float:
    """MB/s writing n blocks of `size` bytes into one file (no fsync: what a job does)."""
    block = os.urandom(size)
    path = root / "raw.bin"
    t = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(n):
            f.write(block)
    dt = time.perf_counter() - t
    path.unlink()
    return size * n / dt / 1e6


def profiled(fn, top: int = 12) -> tuple[float, str]:
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    fn()
    pr.disable()
    dt = time.perf_counter() - t
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(top)
    return dt, out.getvalue()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dirs", nargs="+", type=Path, default=[Path(tempfile.gettempdir()), Path("/dev/shm")])
    p.add_argument("--overlay", default="jpeg")
    args = p.parse_args()
    photos = workload()["jpeg_800x600"]
    for base in args.dirs:
        if base.is_dir():
            probe_dir(base, photos, args.overlay)
    return 0


def probe_dir(base: Path, photos: list[bytes], overlay: str) -> None:
    root = Path(tempfile.mkdtemp(prefix="io-probe-", dir=base))
    print(f"== {base}: raw write {raw_write(root):.0f} MB/s (72 KB blocks)", flush=True)
    s = default_settings(
        engine={"device": "cpu", "backend": "eager", "backends": ("eager",)},
        service={"data_dir": root, "broker_url": None},
        jobs={"overlay_format": overlay},
        limits={"max_batch_items": 4096},
    )
    ex = InProcessExecutor(s)
    ex.warmup()
    pb = ex.runtime.process(
        [photos[i % len(photos)] for i in range(64)], ["the red one"] * 64, Controls(), overlay
    )
    size = sum(len(x or b"") for x in pb.overlays) / 64
    t = time.perf_counter()
    job, _ = batch.create_batch_job(_zip(photos, 2048, ".jpg"), "the red one", None, s, ex.store)
    print(f"unpack: {(time.perf_counter() - t) / 2048 * 1e3:.3f} ms/item; overlay {size / 1e3:.0f} KB")
    jd = batch.job_dir(s, job)
    (jd / "results").mkdir(exist_ok=True)
    items = load_items(jd)
    ext = OVERLAY_EXTENSIONS.get(overlay, "")
    keys = [batch._key(it) for it in items]

    def write_step(k: int) -> None:
        step = keys[k * 64 : (k + 1) * 64]
        names = parts.picture_names(step, pb.overlays, pb.outputs.ok, ext)
        parts.write_part(jd, step_table(step, pb.outputs, pb.errors, names), names, pb.overlays)

    dt, prof = profiled(lambda: [write_step(k) for k in range(32)])
    print(f"write stage: {dt / 2048 * 1e3:.3f} ms/item\n{prof}", flush=True)
    dt, prof = profiled(lambda: build_results_zip(jd))
    print(
        f"results.zip: {dt / 2048 * 1e3:.3f} ms/item, {os.path.getsize(jd / 'results.zip') / 1e6:.0f} MB\n{prof}",
        flush=True,
    )
    ex.close()


if __name__ == "__main__":
    raise SystemExit(main())
