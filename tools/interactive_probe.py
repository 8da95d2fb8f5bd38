"""Where an interactive request's CPU goes, in-process: N callers (threads) through the project's
InProcessExecutor, timed for each batcher size asked for on one warm engine, after the batcher's
two stages (decode, engine) are timed alone per batch size. For where the GIL's time goes run it
under `py-spy record --gil` (tools/gpu_probe.sh does).

    python tools/interactive_probe.py [--device cuda] [--clients 32] [--requests 4096]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arrcoc.bench.e2e import QUERIES, _Lent, workload  # noqa: E402
from arrcoc.bench.load import run_load  # noqa: E402
from arrcoc.service.client.inprocess import InProcessExecutor  # noqa: E402
from arrcoc.settings import default_settings  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="compiled")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    p.add_argument("--requests", type=int, default=4096)
    p.add_argument(
        "--max-batch",
        type=int,
        nargs="+",
        default=[32],
        help="ARRCOC_BATCHING__MAX_SIZE values to try (one warm engine shared)",
    )
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        nargs="+",
        default=[sys.getswitchinterval() * 1e3],
        help="the interpreter's GIL switch intervals to try (sys.setswitchinterval), per batcher size",
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    s = default_settings(
        engine={"device": args.device, "backend": args.backend, "backends": (args.backend,)},
        service={"broker_url": None, "data_dir": Path(tempfile.mkdtemp(prefix="interactive-probe-"))},
    )
    first = InProcessExecutor(s)
    first.warmup()
    image = workload()["jpeg_800x600"][1]
    out = [_decode_alone(first, image)]
    print(f"== decode alone (the batcher's first stage, synchronised): {out[-1]}", flush=True)
    for max_batch in args.max_batch:
        ex = InProcessExecutor(s.replace(batching={"max_size": max_batch}), pipeline=first.runtime.pipeline)
        try:
            # the batcher's result (three stages on a GPU) against the pipeline's own, same bucket
            via, direct = ex.infer(image, QUERIES[0]), ex.runtime.pipeline.infer([image], QUERIES[0])[0]
            print(
                f"== parity, batcher vs pipeline: relevance max |diff| "
                f"{float(abs(via.relevance - direct.relevance).max()):.2e}, same cells "
                f"{bool((via.selected == direct.selected).all())}",
                flush=True,
            )
            for ms in args.switch_interval_ms:
                sys.setswitchinterval(ms / 1e3)
                print(f"== switch interval {ms} ms", flush=True)
                out += [row | {"switch_interval_ms": ms} for row in _measure(args, ex, image, max_batch)]
        finally:
            ex.close()
    first.close()
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def _decode_alone(ex: InProcessExecutor, image: bytes) -> dict:
    """ms per batch of the engine's decode path alone (header checks, nvJPEG or Pillow, resize),
    the same image k times, and the engine's own run on those pixels: the two stages of the
    interactive batcher, each timed by itself."""
    import torch

    from arrcoc.request import Controls

    pipe = ex.runtime.pipeline
    sync = torch.cuda.synchronize if pipe.device.type == "cuda" else (lambda: None)
    row: dict = {"decode_ms": {}, "engine_ms": {}, "finish_ms": {}, "nvjpeg_ms": {}}
    for k in (1, 8, 16, 32):
        times, runs, finishes, nvjpegs = [], [], [], []
        for _ in range(12):
            if (
                pipe.decoder.gpu
            ):  # the batcher's own decode stage (headers read by the callers), and nvJPEG alone
                from torchvision.io import ImageReadMode, decode_jpeg

                started = [pipe.decoder.start(image) for _ in range(k)]
                t0 = time.perf_counter()
                pipe.decoder.finish(started)
                sync()
                t1 = time.perf_counter()
                decode_jpeg(
                    [torch.frombuffer(bytearray(image), dtype=torch.uint8) for _ in range(k)],
                    mode=ImageReadMode.RGB,
                    device=pipe.device,
                )
                sync()
                finishes.append((t1 - t0) * 1e3)
                nvjpegs.append((time.perf_counter() - t1) * 1e3)
            t0 = time.perf_counter()
            prepared = pipe.prepare_many([image] * k, ["the red one"] * k, Controls())
            sync()
            t1 = time.perf_counter()
            pipe.run([p[0] for p in prepared])
            t2 = time.perf_counter()
            times.append((t1 - t0) * 1e3)
            runs.append((t2 - t1) * 1e3)
        row["decode_ms"][k] = round(sorted(times)[len(times) // 2], 3)
        row["engine_ms"][k] = round(sorted(runs)[len(runs) // 2], 3)
        if finishes:
            row["finish_ms"][k] = round(sorted(finishes)[len(finishes) // 2], 3)
            row["nvjpeg_ms"][k] = round(sorted(nvjpegs)[len(nvjpegs) // 2], 3)
    return row


def _measure(args: argparse.Namespace, ex: InProcessExecutor, image: bytes, max_batch: int) -> list[dict]:
    lent = _Lent(ex)
    out = []
    run_load(lent, image, QUERIES, 8, 256, timeout=120.0)  # warm the batcher's threads and caches
    for clients in args.clients:
        n = args.requests if clients > 1 else min(args.requests, 1024)
        cpu0, t0 = time.process_time(), time.perf_counter()
        timed = run_load(lent, image, QUERIES, clients, n, timeout=120.0)
        cores = (time.process_time() - cpu0) / (time.perf_counter() - t0)
        row = {
            "max_batch": max_batch,
            "clients": clients,
            "requests": n,
            "req_s": timed["throughput_rps"],
            "p50_ms": timed["p50_ms"],
            "p99_ms": timed["p99_ms"],
            "process_cores": round(cores, 2),
            "timings_ms_mean": timed.get("timings_ms_mean"),
            "batch_sizes": timed.get("buckets"),
        }
        out.append(row)
        print(
            f"== max batch {max_batch}, {clients} callers: {row['req_s']} req/s, p50 {row['p50_ms']} ms, "
            f"p99 {row['p99_ms']} ms, {row['process_cores']} cores",
            flush=True,
        )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
