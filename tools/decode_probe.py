"""Where the GPU decode stage's time goes (issue 12): a batch of the benchmark's 800x600 JPEGs
through the project's Decoder, and each part of it alone, on one GPU.

Per batch size: nvJPEG's batched decode (wall and this thread's CPU), one call per image, the
same photos saved progressive (nvJPEG's software path: Huffman on the host), the stack + resize
(float32, and float16 for comparison), and the whole `Decoder.finish`; a torch.profiler table
of `finish`; and, with `--backend`, the decode stage and the engine run together in two threads, as the batcher
runs them, against each alone.

    python tools/decode_probe.py [--batch 16 32 64] [--backend compiled] [--json out.json]
    python tools/decode_probe.py --photos jpeg_4032x3024 --view-side 1024 --batch 16 64   # a batch job's 12 MP step
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

from arrcoc.bench.e2e import QUERIES, workload  # noqa: E402
from arrcoc.images import ImageLimits  # noqa: E402
from arrcoc.preprocess import Decoder, _view_size, jpeg_tensor, resize  # noqa: E402


def timed(fn, reps: int = 30, warm: int = 3) -> dict[str, float]:
    """Median wall and thread-CPU ms of fn() followed by a device synchronise."""
    for _ in range(warm):
        fn()
        torch.cuda.synchronize()
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        torch.cuda.synchronize()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
    return {"wall_ms": round(statistics.median(wall), 3), "cpu_ms": round(statistics.median(cpu), 3)}


def progressive(jpeg: bytes) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).save(buf, "JPEG", quality=90, progressive=True)
    return buf.getvalue()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--backend", default=None, help="also run the engine beside the decode stage")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--photos", default="jpeg_800x600", help="which of the e2e workload's JPEGs")
    p.add_argument("--view-side", type=int, default=None, help="overlay views too, as a batch job decodes")
    args = p.parse_args()
    dev = torch.device("cuda")
    photos = workload()[args.photos]
    dec = Decoder(dev, 512, ImageLimits())
    report: dict = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "batches": []}
    import torchvision

    report["torchvision"] = torchvision.__version__
    for n in args.batch:
        row = measure_batch(n, photos, dec, dev, args.view_side)
        print(json.dumps(row), flush=True)
        report["batches"].append(row)
    started = [dec.start(photos[i % len(photos)]) for i in range(16)]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            dec.finish(started)
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50)
    print(table, flush=True)
    report["profile_finish_16"] = table
    if args.backend:
        report["together"] = together(args, photos)
        print(json.dumps(report["together"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def measure_batch(
    n: int, photos: list[bytes], dec: Decoder, dev: torch.device, view_side: int | None = None
) -> dict:
    """Each part of decoding n photos, alone (median ms per batch)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    jpegs = [photos[i % len(photos)] for i in range(n)]
    datas = [jpeg_tensor(b) for b in jpegs]
    pdatas = [jpeg_tensor(progressive(b)) for b in jpegs[:16]]
    started = [dec.start(b) for b in jpegs]
    decoded = decode_jpeg(datas, mode=ImageReadMode.RGB, device=dev)
    f16 = lambda x: F.interpolate(x.half(), size=(512, 512), mode="bilinear", antialias=True)  # noqa: E731
    return {
        "batch": n,
        "header_checks": timed(lambda: [dec.start(b) for b in jpegs]),
        "decode_jpeg_batched": timed(lambda: decode_jpeg(datas, mode=ImageReadMode.RGB, device=dev)),
        "decode_jpeg_one_by_one": timed(
            lambda: [decode_jpeg(d, mode=ImageReadMode.RGB, device=dev) for d in datas]
        ),
        "decode_jpeg_progressive": timed(lambda: decode_jpeg(pdatas, mode=ImageReadMode.RGB, device=dev)),
        "stack": timed(lambda: torch.stack(decoded)),
        "stack_resize_f32": timed(lambda: resize(torch.stack(decoded), 512, 512)),
        "stack_resize_f16": timed(lambda: f16(torch.stack(decoded)).round_().clamp_(0, 255).to(torch.uint8)),
        "finish": timed(lambda: dec.finish(started)),
        "finish_with_views": timed(lambda: dec.finish(started, view_side)) if view_side else None,
        "views_resize": timed(
            lambda: resize(torch.stack(decoded), *_view_size(*decoded[0].shape[1:], view_side))
        )
        if view_side
        else None,
    }


def together(args, photos: list[bytes]) -> dict:
    """The batcher's two stages (decode on a stream of its own, the engine), alone and at once."""
    from arrcoc.pipeline import RelevancePipeline

    pipe = RelevancePipeline("arrcoc-texture", "default", args.backend, "cuda", buckets=(16,))
    pipe.warmup()
    reqs = [pipe.prepare(photos[i % len(photos)], QUERIES[0]) for i in range(16)]
    ready = pipe.decode_pending(reqs)
    stream = torch.cuda.Stream()

    def decode_once():
        with torch.cuda.stream(stream):
            pipe.decode_pending(reqs)
        stream.synchronize()

    def engine_once():
        pipe.run(ready)

    def loop(fn, stop, counts, key):
        n = 0
        while not stop.is_set():
            fn()
            n += 1
        counts[key] = n

    out = {}
    for name, fns in (
        ("decode_alone", {"decode": decode_once}),
        ("engine_alone", {"engine": engine_once}),
        ("both", {"decode": decode_once, "engine": engine_once}),
    ):
        for fn in fns.values():
            fn()
        stop, counts = threading.Event(), {}
        threads = [threading.Thread(target=loop, args=(fn, stop, counts, k)) for k, fn in fns.items()]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        stop.set()
        for t in threads:
            t.join()
        dt = time.perf_counter() - t0
        out[name] = {k: round(dt * 1e3 / v, 3) for k, v in counts.items()}  # ms per batch of 16
    return out


if __name__ == "__main__":
    raise SystemExit(main())
