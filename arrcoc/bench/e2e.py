"""`arrcoc bench e2e`: the whole system, bytes in -> results out, as a user meets it.

A fixed workload of real photos (scikit-image's, cropped and resized to 800x600 and to 4032x3024
JPEG, plus PNGs) through the project's own executors:
- batch jobs: a zip submitted until its results zip is complete, in images/s, with the GPU's busy
  fraction (nvidia-smi, sampled every 100 ms) and where the time went per stage (unpack, read,
  decode, engine, render + encode, write; the job runner's own accounting);
- the engine alone on the same items at the same batch size, for comparison, and the job's other
  stages each alone on one thread (decoding, overlays), which bound a job in one process;
- two peer scripts as a competent user writes them, on the same 800x600 photos and model
  (arrcoc.bench.peers: a DataLoader with Pillow worker processes; one process with a read-ahead
  thread and batched nvJPEG decoding), beside the job with and without overlays;
- interactive requests: p50/p99 with 1 caller, throughput and p50/p99 with 32 concurrent callers,
  with the per-request split the results carry (decode + resize, engine, the rest);
- all of it in-process and through Celery (a redis-server and an `arrcoc worker` started here).
The report is JSON (with the environment) and a markdown table, beside `arrcoc bench`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image

from ..engine import resolve_device
from ..registry import RANDOM_WEIGHTS, get_variant
from ..request import Controls
from ..service.jobs.batch import step_items as batch_step_items
from ..service.jobs.batch import steps_in_flight as batch_steps_in_flight
from ..service.jobs.files import job_dir
from ..settings import LimitSettings, Settings, default_settings
from .env import collect_env
from .load import percentile, run_load
from .parity import dtype_parity

QUERIES = (
    "the red one",
    "the top right",
    "the text",
    "the orange suit",
    "the left side",
    "the green eyes",
    "the bright area",
    "the dark corner",
)
PHOTOS = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "colorwheel",
)


@dataclass(frozen=True)
class E2EConfig:
    device: str = "auto"
    backend: str = "compiled"
    variant: str = "arrcoc-texture"  # any registered variant
    # None: the variant's bundled weights, or for a variant whose weights come from the hub (CLIP)
    # random weights of its real shapes ("random": same speed, nothing downloaded; the report says so)
    weights: str | None = None
    # auto | float32 | bfloat16, as ARRCOC_ENGINE__DTYPE (auto: bfloat16 for CLIP on a GPU)
    dtype: str = "auto"
    # 800x600 JPEGs in the batch job; None: ITEMS for the device (a GPU's job runs for seconds)
    items: int | None = None
    large_items: int = 256  # 4032x3024 JPEGs (12 MP)
    png_items: int = 128  # 800x600 PNGs
    requests: int = 2048  # interactive requests with one caller (at most 256) and, twice as many, with many
    clients: int = 32
    celery: bool = True
    worker_processes: int = 8  # Celery processes feeding the engine processes
    engine_processes: int | None = None  # in the worker group, sharing the device (None: 1, as compose.yaml)
    client_processes: int = 8  # client processes driving the Celery measurements
    redis_io_threads: int = 1  # redis-server's I/O threads (its --io-threads)
    overlay: str = "jpeg"
    # a worker group over these devices (e.g. cuda:0,cuda:1) beside one over the first alone, in
    # the same run: batch job and many callers through Celery, with the callers scaled by the
    # number of devices (the same load per device); worker_processes and engine_processes per device
    devices: tuple[str, ...] = ()
    inprocess: bool = True  # the in-process phases (off: only the Celery ones, e.g. for the devices)
    peers: bool = True  # the two hand-written peer scripts (arrcoc.bench.peers) on the 800x600 photos
    # the many-callers phases and each batch job run this many times in a row; the figure is the
    # round of median req/s or images/s, every round listed beside it (runs of the same code minutes
    # apart differ on a lent machine: BENCHMARKS.md)
    rounds: int = 3


# what the zip of the largest job may take per item: well above any of the workload's 800x600 JPEGs
# at least what the disk budget reserves for one of the run's items, its overlay included
RESERVED_ITEM_BYTES = 8 << 20
ZIPPED_ITEM_BYTES = 256 * 1024
# the standard 800x600 job per device type: seconds of work on a GPU, minutes on a small CPU
ITEMS = {"cuda": 8192, "cpu": 2048}


# -- the workload ---------------------------------------------------------------------------------
def _photo(name: str) -> Image.Image:
    from skimage import data

    arr = getattr(data, name)()
    if arr.ndim == 2:
        arr = np.stack([arr] * 3, axis=-1)
    return Image.fromarray(arr[..., :3].astype(np.uint8))


def _fit(img: Image.Image, w: int, h: int) -> Image.Image:
    """Centre-crop to w:h, then resize to w x h."""
    sw, sh = img.size
    scale = min(sw / w, sh / h)
    cw, ch = int(w * scale), int(h * scale)
    left, top = (sw - cw) // 2, (sh - ch) // 2
    return img.crop((left, top, left + cw, top + ch)).resize((w, h), Image.Resampling.BICUBIC)


def _encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def workload() -> dict[str, list[bytes]]:
    """Distinct encoded photos per kind (a job cycles through them)."""
    photos = [_photo(n) for n in PHOTOS]
    return {
        "jpeg_800x600": [_encode(_fit(p, 800, 600), "JPEG") for p in photos],
        "jpeg_4032x3024": [_encode(_fit(p, 4032, 3024), "JPEG") for p in photos[:4]],
        "png_800x600": [_encode(_fit(p, 800, 600), "PNG") for p in photos[:4]],
    }


EXTENSIONS = {"jpeg_800x600": ".jpg", "jpeg_4032x3024": ".jpg", "png_800x600": ".png"}


def _zip(images: list[bytes], n: int, ext: str) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:  # photos are compressed already
        for i in range(n):
            zf.writestr(f"img{i:05d}{ext}", images[i % len(images)])
    return buf.getvalue()


# -- measuring ------------------------------------------------------------------------------------
class GpuBusy:
    """The GPUs' mean utilisation (nvidia-smi, every 100 ms) while the block runs; None without one.
    `devices`: how many GPUs, from `device`'s index on (a worker group over several)."""

    def __init__(self, device: torch.device, devices: int = 1):
        self.device = device
        self.devices = devices
        self.samples: list[float] = []

    def __enter__(self) -> GpuBusy:
        self._proc = None
        if self.device.type == "cuda":
            index = self.device.index or 0
            gpus = ",".join(str(index + i) for i in range(self.devices))
            self._proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "-i",
                    gpus,
                    "--query-gpu=utilization.gpu",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "100",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()) / 100.0)
            except ValueError:
                continue

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(5)

    @property
    def fraction(self) -> float | None:
        return round(float(np.mean(self.samples)), 3) if self.samples else None


def batch_job(
    ex, archive: bytes, n: int, device: torch.device, overlays: str, devices: int = 1
) -> dict[str, Any]:
    """One batch job asking for `overlays` (none, relevance or foveated), from submission until its
    results zip is complete."""
    with GpuBusy(device, devices) as busy:
        t0, cpu0 = time.perf_counter(), time.process_time()
        job = ex.submit_batch(archive, "the red one", overlays=overlays)
        t_unpacked = time.perf_counter()
        while not ex.status(job).state.finished:
            time.sleep(0.01)
        path = ex.batch_results(job)
        wall = time.perf_counter() - t0
        cores = (time.process_time() - cpu0) / wall
    st = ex.status(job)
    stages = json.loads(ex.store.record(job).get("stage_ms") or "{}")
    stages["unpack"] = (t_unpacked - t0) * 1e3
    with zipfile.ZipFile(path) as zf, zf.open("results.parquet") as f:
        table = pq.read_table(f, columns=["overlay"])  # each row's picture in the zip, or null
    # measured: its files go, so that the next job does not write while the kernel still writes
    # this one's back to disk (and the runs of a session do not fill it)
    shutil.rmtree(job_dir(ex.settings, job), ignore_errors=True)
    return {
        "items": n,
        "overlays": overlays,
        "done": st.done,
        "failed": st.failed,
        "rows": table.num_rows,
        "pictures": table.num_rows - table["overlay"].null_count,
        "wall_s": round(wall, 3),
        "images_per_s": round(n / wall, 1),
        "gpu_busy": busy.fraction,
        # this process's CPU time over wall: in-process, ~1-2 of 16 cores busy means one thread
        # at a time (the GIL) bounds the job; through Celery the work is in the worker group
        "process_cores": round(cores, 2),
        "stage_ms_per_item": {k: round(v / n, 3) for k, v in sorted(stages.items())},
    }


def repeated_job(
    ex, archive: bytes, n: int, device: torch.device, overlays: str, rounds: int = 1, devices: int = 1
) -> dict[str, Any]:
    """The job once, then `rounds` times: the figure is the timed job of median images/s, the first
    beside it (the first large job after start-up runs slower: caches and allocators still warming),
    and every timed job's images/s and GPU busy under `rounds` (the same code's job moves from one
    run to the next on a lent machine)."""
    first = batch_job(ex, archive, n, device, overlays, devices)
    runs = [batch_job(ex, archive, n, device, overlays, devices) for _ in range(max(1, rounds))]
    return _median(runs, "images_per_s", ("gpu_busy",)) | {"first_images_per_s": first["images_per_s"]}


def _median(runs: list[dict[str, Any]], key: str, also: tuple[str, ...]) -> dict[str, Any]:
    """The run of median `key`, with every run's `key` and `also` under `rounds`."""
    median = sorted(runs, key=lambda r: r[key])[len(runs) // 2]
    return median | {"rounds": [{k: r[k] for k in (key, *also)} for r in runs]}


def _cycle(items: list, n: int) -> list:
    """`n` items taken from `items` round and round."""
    return [items[i % len(items)] for i in range(n)]


def engine_alone(runtime, images: list[bytes], n: int, step: int) -> dict[str, Any]:
    """The engine on the same items at the same batch size, pixels decoded beforehand."""
    pipe = runtime.pipeline
    prepared = [p[0] for p in pipe.prepare_many(images, ["the red one"] * len(images))]
    reqs = _cycle(prepared, step)
    runtime.run_batch(reqs)  # warm
    sync = torch.cuda.synchronize if pipe.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(max(1, n // step)):
        runtime.run_batch(reqs)
    sync()
    wall = time.perf_counter() - t0
    return {
        "items": max(1, n // step) * step,
        "batch": step,
        "images_per_s": round(max(1, n // step) * step / wall, 1),
    }


def stages_alone(runtime, work: dict[str, list[bytes]], n: int, step: int, large: int = 0) -> dict[str, Any]:
    """The job's other stages each alone on one thread, on the same photos at the same step size:
    decoding (the engine's pixels and the overlays' views, as a job with overlays decodes; the
    pixels alone, as one without) and drawing and encoding the overlays (the job's format and
    quality); the 12 MP photos' decoding (with views) when `large`;
    and an interactive batch's decoding (`interactive_batch` images, no views). In one process
    each is one nvJPEG decoder or encoder on a GPU, which serves one call at a time: a job there
    cannot run its items faster than the slowest of them."""
    from .. import overlays

    pipe, s = runtime.pipeline, runtime.settings
    sync = torch.cuda.synchronize if pipe.device.type == "cuda" else (lambda: None)
    view_side = s.jobs.overlay_max_side

    def rate(work_fn, items: int, per_call: int) -> dict[str, Any]:
        work_fn()  # warm
        sync()
        calls = max(1, items // per_call)
        t0 = time.perf_counter()
        for _ in range(calls):
            work_fn()
        sync()
        return {
            "items": calls * per_call,
            "batch": per_call,
            "images_per_s": round(calls * per_call / (time.perf_counter() - t0), 1),
        }

    photos = _cycle(work["jpeg_800x600"], step)
    out = {
        "decode": rate(lambda: pipe.decoder.decode(photos, view_side), n, step),
        "decode_pixels": rate(lambda: pipe.decoder.decode(photos), n, step),
    }
    done = runtime.process(photos, ["the red one"] * step, Controls(), s.jobs.overlay_format)
    views = [p.view for p in pipe.decoder.decode(photos, view_side)]
    maps = done.outputs.relevance
    out["overlays"] = rate(
        lambda: overlays.encode(views, maps, s.jobs.overlay_format, s.jobs.overlay_jpeg_quality),
        n,
        step,
    )
    if large:
        big = _cycle(work["jpeg_4032x3024"], min(step, large))
        out["decode_12mp"] = rate(lambda: pipe.decoder.decode(big, view_side), large, len(big))
    size = runtime.interactive_batch
    few = _cycle(work["jpeg_800x600"], size)
    out["decode_interactive"] = rate(lambda: pipe.decoder.decode(few), n, size)
    return out


def steps_alone(runtime, images: list[bytes], n: int, step: int, in_flight: int) -> dict[str, Any]:
    """The job's steps as its step threads run them, `in_flight` at once (each on a thread and a
    CUDA stream of its own): decoded, run on the engine, overlays drawn and encoded, outputs on the
    host; no file read or written, no rows, no job store. The job runs its items no faster."""
    s = runtime.settings
    photos = _cycle(images, step)
    queries = ["the red one"] * step
    one = lambda _: runtime.process(photos, queries, Controls(), s.jobs.overlay_format)  # noqa: E731
    steps = max(in_flight, n // step)
    with ThreadPoolExecutor(in_flight, thread_name_prefix="arrcoc-step") as pool:
        list(pool.map(one, range(in_flight)))  # warm: each thread's stream
        t0 = time.perf_counter()
        list(pool.map(one, range(steps)))
        wall = time.perf_counter() - t0
    return {
        "items": steps * step,
        "batch": step,
        "in_flight": in_flight,
        "images_per_s": round(steps * step / wall, 1),
    }


def stages_in_series(report: dict[str, Any]) -> dict[str, float] | None:
    """The 800x600 job's three device stages alone (engine, decoding, overlays) one after
    another, in images/s, and the in-process job over it: above 1 where the job overlaps them,
    below where it adds work of its own or they slow each other down."""
    job, eng, alone = (
        report.get("batch_inprocess", {}).get("jpeg_800x600"),
        report.get("engine_alone"),
        report.get("stages_alone") or {},
    )
    if not (job and eng and "decode" in alone and "overlays" in alone):
        return None
    rates = (eng["images_per_s"], alone["decode"]["images_per_s"], alone["overlays"]["images_per_s"])
    series = 1.0 / sum(1.0 / r for r in rates)
    return {"images_per_s": round(series, 1), "job_over": round(job["images_per_s"] / series, 3)}


def job_over_engine_alone(report: dict[str, Any]) -> dict[str, Any] | None:
    """The in-process 800x600 job's images/s over the engine alone's at the same batch size,
    timed just before and just after it: against their mean (the machine's speed while the job
    ran) and against the faster of the two; under "no_overlays" the same for the job without
    overlays (results.parquet only), when it ran."""
    jobs = report.get("batch_inprocess", {})
    eng, after = report.get("engine_alone"), report.get("engine_alone_after")
    if not (jobs.get("jpeg_800x600") and eng and after):
        return None
    a, b = eng["images_per_s"], after["images_per_s"]

    def over(job: dict[str, Any]) -> dict[str, float]:
        return {
            "against_mean": round(job["images_per_s"] / ((a + b) / 2), 3),
            "against_faster": round(job["images_per_s"] / max(a, b), 3),
        }

    out: dict[str, Any] = over(jobs["jpeg_800x600"])
    if jobs.get("jpeg_800x600_no_overlays"):
        out["no_overlays"] = over(jobs["jpeg_800x600_no_overlays"])
    return out


def decode_parity(runtime, work: dict[str, list[bytes]]) -> dict[str, Any] | None:
    """How far the GPU's decoding (nvJPEG + resize on the device) moves the results from Pillow's,
    on the workload's JPEGs: None where the GPU path does not run."""
    from ..preprocess import Decoder

    pipe = runtime.pipeline
    if not pipe.decoder.gpu:
        return None
    cpu = Decoder(torch.device("cpu"), pipe.variant.image_size, pipe.limits)
    images = work["jpeg_800x600"] + work["jpeg_4032x3024"]
    rows = []
    for kind, decoder in (("gpu", pipe.decoder), ("cpu", cpu)):
        pixels = [p.pixels.to(pipe.device) for p in decoder.decode(images)]
        prepared = pipe.prepare_many(images, ["the red one"] * len(images))
        reqs = [dataclasses.replace(p[0], pixels=px) for p, px in zip(prepared, pixels, strict=True)]
        rows.append((kind, runtime.run_batch(reqs), pixels))
    (_, gpu, gpx), (_, cpu_res, cpx) = rows
    rel = [float(np.abs(a.relevance - b.relevance).max()) for a, b in zip(gpu, cpu_res, strict=True)]
    overlap = [
        len(set(a.selected.tolist()) & set(b.selected.tolist())) / len(a.selected)
        for a, b in zip(gpu, cpu_res, strict=True)
    ]
    levels = [float((a.int() - b.int()).abs().float().mean()) for a, b in zip(gpx, cpx, strict=True)]
    return {
        "images": len(images),
        "pixel_mean_abs_levels": round(float(np.mean(levels)), 3),
        "relevance_max_abs_diff": {"max": round(max(rel), 5), "median": round(float(np.median(rel)), 5)},
        "top_k_overlap": {"min": round(min(overlap), 3), "mean": round(float(np.mean(overlap)), 3)},
        "top1_same": sum(int(a.selected[0] == b.selected[0]) for a, b in zip(gpu, cpu_res, strict=True)),
    }


def interactive(
    make_executor, image: bytes, clients: int, requests: int, processes: int = 1
) -> dict[str, Any]:
    t0, cpu0 = time.perf_counter(), time.process_time()
    report = run_load(make_executor, image, QUERIES, clients, requests, timeout=120.0, processes=processes)
    report["process_cores"] = round((time.process_time() - cpu0) / (time.perf_counter() - t0), 2)
    t = report["timings_ms_mean"]
    report["stage_ms_mean"] = {
        "decode_resize": t.get("preprocess_ms"),
        "batch_decode": t.get("batch_decode_ms"),
        "engine_batch": t.get("model_ms"),
        "queue_and_rest": round(report["mean_ms"] - _own_batch_ms(t), 3),
    }
    return report


def _own_batch_ms(t: dict[str, float]) -> float:
    """A request's own check, decode and engine batch, from its mean timings: on a GPU the caller
    only checks the header (preprocess_ms) and its batch decodes (batch_decode_ms)."""
    return t.get("preprocess_ms", 0.0) + t.get("batch_decode_ms", 0.0) + t.get("model_ms", 0.0)


def celery_legs(row: dict[str, Any]) -> dict[str, float] | None:
    """Where a request's mean goes through Celery, from the timings each result carries: outside
    the task (the client's send, Celery's delivery, the reply's way back), in the task around the
    engine call (the image fetched, the reply pushed), the engine process's round trip, and of that
    its own check, decode and engine. `ceiling_rps`: what the callers, each waiting for its answer
    before it sends again, could make at most if no request waited for a batch ahead of its own.
    None for a path without a task (in-process)."""
    t = row.get("timings_ms_mean") or {}
    if "task_wall_ms" not in t or "engine_wall_ms" not in t:
        return None
    outside = row["mean_ms"] - t["task_wall_ms"]
    around = t["task_wall_ms"] - t["engine_wall_ms"]
    own = _own_batch_ms(t)
    return {
        "outside_task_ms": round(outside, 1),
        "around_engine_call_ms": round(around, 1),
        "engine_round_trip_ms": round(t["engine_wall_ms"], 1),
        "own_batch_ms": round(own, 1),
        "ceiling_rps": round(row["clients"] / (outside + around + own) * 1e3, 1),
    }


def interactive_rounds(
    make_executor, image: bytes, clients: int, requests: int, processes: int = 1, rounds: int = 1
) -> dict[str, Any]:
    """`interactive` `rounds` times in a row: the round of median throughput, with every round's
    req/s, p50 and p99 under `rounds`."""
    runs = [interactive(make_executor, image, clients, requests, processes) for _ in range(max(1, rounds))]
    return _median(runs, "throughput_rps", ("p50_ms", "p99_ms"))


def e2e_weights(cfg: E2EConfig) -> str | None:
    """The weights setting the run serves: the one given, else random weights of the real shapes
    for a variant that would fetch its weights from the hub, else the variant's bundled ones (None)."""
    if cfg.weights is not None:
        return cfg.weights
    return RANDOM_WEIGHTS if get_variant(cfg.variant).load is not None else None


def _settings(cfg: E2EConfig, data_dir: Path) -> Settings:
    return default_settings(
        engine={
            "device": cfg.device,
            "backend": cfg.backend,
            "backends": (cfg.backend,),
            "variant": cfg.variant,
            "weights": e2e_weights(cfg),
            "dtype": cfg.dtype,
        },
        jobs={"overlay_format": cfg.overlay},
        service={"broker_url": None, "data_dir": data_dir},
        limits=_limits(cfg),
    )


def serving(runtime) -> dict[str, Any]:
    """What the run served: variant, weights (random: timing only), dtype, grid and image size."""
    pipe = runtime.pipeline
    version = pipe.weights_version
    return {
        "variant": pipe.variant.name,
        "weights_version": version,
        "random_weights": version in ("random", "untrained"),
        "dtype": str(pipe.backend.dtype).removeprefix("torch."),
        "image_size": pipe.variant.image_size,
        "grid": pipe.variant.grid,
    }


def serving_dtype_parity(runtime, work: dict[str, list[bytes]]) -> dict[str, Any] | None:
    """The served dtype against float32 (arrcoc.bench.parity.dtype_parity) on the workload's photos
    with the benchmark's queries, on the serving device; None when float32 is served."""
    pipe = runtime.pipeline
    if pipe.backend.dtype == torch.float32:
        return None
    images = work["jpeg_800x600"] + work["jpeg_4032x3024"]
    pixels = torch.stack([d.pixels for d in pipe.decoder.decode(images)]).to(pipe.device)
    query = pipe.encoder.encode([QUERIES[i % len(QUERIES)] for i in range(len(images))]).to(pipe.device)
    with runtime.device_lock:
        return dtype_parity(pipe.model, pixels, query, dtype=pipe.backend.dtype).to_json()


def standard_items(cfg: E2EConfig, device: torch.device) -> int:
    """The 800x600 job's items: the configured number, else the device type's standard job."""
    return cfg.items if cfg.items is not None else ITEMS.get(device.type, ITEMS["cpu"])


def _max_items(cfg: E2EConfig) -> int:
    """The largest job the run submits (over several devices, the 800x600 job times their number)."""
    return max(cfg.items * max(1, len(cfg.devices)), cfg.large_items, cfg.png_items, 1)


def _limits(cfg: E2EConfig) -> dict[str, int]:
    """The input limits raised to let the run's largest job in (its items, its zip's entries and
    bytes, what it reserves of the disk: a job over several devices is several times the standard
    one); the whole data store for the run's one owner, whose jobs go one after another."""
    n = _max_items(cfg)
    zipped = max(LimitSettings().max_archive_bytes, n * ZIPPED_ITEM_BYTES)
    disk = max(LimitSettings().max_data_bytes, n * RESERVED_ITEM_BYTES)
    return {
        "max_batch_items": n,
        "max_archive_entries": n + 16,
        "max_archive_bytes": zipped,
        "max_unpacked_bytes": 2 * zipped,
        "max_data_bytes": disk,
        "max_owner_bytes": disk,
    }


def versions() -> dict[str, str | None]:
    """The versions of the libraries a job's decoding and results use, beside collect_env's."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("torchvision", "pyarrow", "pillow", "celery", "redis"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def command(cfg: E2EConfig) -> str:
    """The `arrcoc bench e2e` command line that runs this configuration again."""
    flags = {"celery": "--no-celery", "peers": "--no-peers", "inprocess": "--no-inprocess"}
    args = ["python", "-m", "arrcoc", "bench", "e2e"]
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in flags:
            args += [] if value else [flags[f.name]]
        elif value != f.default and value is not None and value != ():
            shown = ",".join(value) if isinstance(value, tuple) else str(value)
            args += [f"--{f.name.replace('_', '-')}", shown]
    return shlex.join(args)


class _Lent:
    """The benchmark's in-process executor lent to run_load as its factory (its clients are threads
    of this process); run_load closes what it gets, the benchmark closes the executor once, at the end."""

    def __init__(self, ex):
        self._ex = ex

    def __call__(self) -> _Lent:
        return self

    def __getattr__(self, name: str):
        return getattr(self._ex, name)

    def close(self) -> None:
        pass


def run_e2e(cfg: E2EConfig, progress=print) -> dict[str, Any]:
    device = resolve_device(cfg.device)
    cfg = dataclasses.replace(cfg, items=standard_items(cfg, device))
    work = workload()
    root = Path(tempfile.mkdtemp(prefix="arrcoc-e2e-"))
    report: dict[str, Any] = {
        "schema": "arrcoc.bench.e2e/1",
        "env": collect_env(device) | versions(),
        "config": asdict(cfg),
        "command": command(cfg),
    }
    try:
        if cfg.inprocess:
            _inprocess(cfg, work, root, device, report, progress)
        if cfg.celery:
            try:
                report.update(_celery(cfg, work, root, device, progress))
            except Exception as e:  # noqa: BLE001 -- the in-process half still stands; say what failed
                report["celery_error"] = f"{type(e).__name__}: {e}"
                progress(f"Celery part failed: {report['celery_error']}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return report


def _inprocess(
    cfg: E2EConfig,
    work: dict[str, list[bytes]],
    root: Path,
    device: torch.device,
    report: dict[str, Any],
    progress,
) -> None:
    settings = _settings(cfg, root / "inprocess")
    progress(
        f"in-process executor: {cfg.variant} ({e2e_weights(cfg) or 'its bundled'} weights, dtype {cfg.dtype}),"
        f" {cfg.backend} on {device}, warming up"
    )
    from ..service.client.inprocess import InProcessExecutor

    ex = InProcessExecutor(settings)
    t0 = time.perf_counter()
    ex.warmup()
    report["warmup_s"] = round(time.perf_counter() - t0, 1)
    report["serving"] = serving(ex.runtime)
    jobs = (
        ("jpeg_800x600", "jpeg_800x600", cfg.items, "relevance"),
        ("jpeg_4032x3024", "jpeg_4032x3024", cfg.large_items, "relevance"),
        ("png_800x600", "png_800x600", cfg.png_items, "relevance"),
        ("jpeg_800x600_no_overlays", "jpeg_800x600", cfg.items, "none"),
    )
    # the engine alone at a batch job's batch size: a step's items per engine-host call
    step = batch_step_items(ex.runtime)
    alone = functools.partial(engine_alone, ex.runtime, work["jpeg_800x600"], min(cfg.items, 1024), step)
    try:
        report["engine_alone"] = alone()
        report["stages_alone"] = stages_alone(ex.runtime, work, min(cfg.items, 1024), step, cfg.large_items)
        report["steps_alone"] = steps_alone(
            ex.runtime,
            work["jpeg_800x600"],
            min(cfg.items, 1024),
            step,
            batch_steps_in_flight(ex.runtime, settings),
        )
        report["decode_parity"] = decode_parity(ex.runtime, work)
        report["dtype_parity"] = serving_dtype_parity(ex.runtime, work)
        report["batch_inprocess"] = {}
        for row, kind, n, overlays in jobs:
            if n:
                progress(f"batch job in-process: {n} x {kind}, overlays {overlays}")
                report["batch_inprocess"][row] = repeated_job(
                    ex, _zip(work[kind], n, EXTENSIONS[kind]), n, device, overlays, cfg.rounds
                )
            if row == "jpeg_800x600":
                # again right after this job: a shared machine's speed drifts over a run, and the
                # job is compared with the engine beside it, before and after
                report["engine_alone_after"] = alone()
        report["job_over_engine_alone"] = job_over_engine_alone(report)
        report["stages_in_series"] = stages_in_series(report)
        image = work["jpeg_800x600"][1]
        shared = _Lent(ex)
        progress("interactive in-process: 1 caller")
        report["interactive_inprocess_1"] = interactive(shared, image, 1, min(cfg.requests, 256))
        progress(f"interactive in-process: {cfg.clients} callers")
        report["interactive_inprocess_n"] = interactive_rounds(
            shared, image, cfg.clients, cfg.requests * 2, rounds=cfg.rounds
        )
    finally:
        ex.close()
    if cfg.peers and cfg.items:
        dtype = (report.get("serving") or {}).get("dtype", "float32")
        report["peers"] = run_peers(cfg, work["jpeg_800x600"], root, device, dtype, step, progress)
        report["job_over_best_peer"] = job_over_best_peer(report)


def run_peers(
    cfg: E2EConfig,
    photos: list[bytes],
    root: Path,
    device: torch.device,
    dtype: str,
    batch: int,
    progress,
) -> dict[str, Any]:
    """Each peer script (arrcoc.bench.peers) in a process of its own on the job's 800x600 photos,
    written out as files, with the model the job served (`dtype`: as it ran) at the job's step
    size (`batch`); its own timing and what it does, and the rows its Parquet file holds."""
    folder = root / "photos"
    folder.mkdir(exist_ok=True)
    for i in range(cfg.items):
        (folder / f"img{i:05d}.jpg").write_bytes(photos[i % len(photos)])
    out: dict[str, Any] = {}
    for peer in ("dataloader", "batched"):
        progress(f"peer script: {peer} on {cfg.items} photos")
        rows = root / f"peer-{peer}.parquet"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "arrcoc.bench.peers",
                peer,
                "--photos",
                str(folder),
                "--out",
                str(rows),
                "--device",
                str(device),
                "--backend",
                cfg.backend,
                "--variant",
                cfg.variant,
                "--weights",
                e2e_weights(cfg) or "default",
                "--dtype",
                dtype,
                "--batch",
                str(batch),
            ],
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if proc.returncode != 0:
            out[peer] = {"error": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
            continue
        out[peer] = json.loads(proc.stdout.strip().splitlines()[-1])
        out[peer]["rows"] = pq.ParquetFile(rows).metadata.num_rows
    return out


def job_over_best_peer(report: dict[str, Any]) -> dict[str, Any] | None:
    """The in-process 800x600 job's images/s (with overlays and without) over the faster peer's."""
    peers = {k: v["images_per_s"] for k, v in report.get("peers", {}).items() if "images_per_s" in v}
    jobs = report.get("batch_inprocess", {})
    if not peers or "jpeg_800x600" not in jobs:
        return None
    best = max(peers, key=peers.get)
    out = {"best_peer": best, "overlays": round(jobs["jpeg_800x600"]["images_per_s"] / peers[best], 3)}
    if "jpeg_800x600_no_overlays" in jobs:
        out["no_overlays"] = round(jobs["jpeg_800x600_no_overlays"]["images_per_s"] / peers[best], 3)
    return out


def _celery(
    cfg: E2EConfig, work: dict[str, list[bytes]], root: Path, device: torch.device, progress
) -> dict[str, Any]:
    """The Celery phases on one worker group (its first device alone when `cfg.devices` names
    several), then, with several devices, the batch job and many callers on a group over all of them."""
    from .processes import RedisServer

    engines = cfg.engine_processes or 1
    devices = list(cfg.devices)
    out: dict[str, Any] = {"celery_engine_processes": engines}
    redis = RedisServer(root / "redis", io_threads=cfg.redis_io_threads)
    try:
        out.update(_celery_group(cfg, work, root / "celery", device, engines, redis, devices[:1], progress))
        if len(devices) > 1:
            every = _celery_group(
                cfg, work, root / "celery-all", device, engines, redis, devices, progress, full=False
            )
            out["celery_devices"] = {"devices": devices, **every}
            out["device_scaling"] = device_scaling(out, every, len(devices))
    finally:
        redis.stop()
    return out


def _celery_group(
    cfg: E2EConfig,
    work: dict[str, list[bytes]],
    root: Path,
    device: torch.device,
    engines: int,
    redis,
    devices: list[str],
    progress,
    full: bool = True,
) -> dict[str, Any]:
    """One worker group (`devices`: `arrcoc worker --devices`, none: the configured device)
    measured: batch jobs, and one caller (`full`) and many; with several devices, the same load per
    device: as many items, callers and client processes per device as the run has for one."""
    from ..service.client.celery_executor import CeleryExecutor
    from .processes import Worker, worker_env

    out: dict[str, Any] = {}
    data = root / "data"
    weights = {"weights": e2e_weights(cfg)} if e2e_weights(cfg) else {}
    per_device = max(1, len(devices))
    env = worker_env(
        redis.url,
        data,
        engine={
            "device": cfg.device,
            "backend": cfg.backend,
            "backends": cfg.backend,
            "variant": cfg.variant,
            "dtype": cfg.dtype,
            **weights,
            "devices": ",".join(devices),
            "worker_processes": cfg.worker_processes,
            "processes": engines,
            "worker_threads": cfg.clients + 4,
        },
        jobs={"overlay_format": cfg.overlay},
        limits=_limits(cfg),
    )
    root.mkdir(parents=True, exist_ok=True)
    worker = Worker(env, root / "worker.log")
    try:
        where = f" on {', '.join(devices)}" if devices else ""
        progress(
            f"Celery: worker group{where} of {cfg.worker_processes} Celery and {engines} engine processes"
            f" per device, warming up"
        )
        worker.ready(900)
        make = functools.partial(
            CeleryExecutor,
            default_settings(service={"broker_url": redis.url, "data_dir": data}, limits=_limits(cfg)),
        )
        ex = make()
        try:
            out["batch_celery"] = {}
            jobs = (
                ("jpeg_800x600", "jpeg_800x600", cfg.items * per_device, "relevance"),
                ("jpeg_800x600_no_overlays", "jpeg_800x600", cfg.items * per_device, "none"),
                ("jpeg_4032x3024", "jpeg_4032x3024", cfg.large_items if full else 0, "relevance"),
            )
            for row, kind, n, overlays in jobs:
                if n:
                    progress(f"batch job through Celery{where}: {n} x {kind}, overlays {overlays}")
                    out["batch_celery"][row] = repeated_job(
                        ex, _zip(work[kind], n, EXTENSIONS[kind]), n, device, overlays, cfg.rounds, per_device
                    )
        finally:
            ex.close()
        image = work["jpeg_800x600"][1]
        if full:
            progress("interactive through Celery: 1 caller")
            out["interactive_celery_1"] = interactive(make, image, 1, min(cfg.requests, 256))
        clients, processes = cfg.clients * per_device, cfg.client_processes * per_device
        progress(f"interactive through Celery{where}: {clients} callers in {processes} processes")
        out["interactive_celery_n"] = interactive_rounds(
            make, image, clients, cfg.requests * 2 * per_device, processes, cfg.rounds
        )
    finally:
        worker.stop()
    return out


def device_scaling(one: dict[str, Any], every: dict[str, Any], n: int) -> dict[str, Any]:
    """Every device's figures over the first device's alone, and over n times it (1.0: linear)."""

    def at(report: dict[str, Any], *path: str) -> Any:
        for key in path:
            report = (report or {}).get(key)
        return report

    out: dict[str, Any] = {"devices": n}
    for name, path, ratio in (
        ("batch_images_per_s", ("batch_celery", "jpeg_800x600", "images_per_s"), True),
        ("interactive_rps", ("interactive_celery_n", "throughput_rps"), True),
        ("interactive_p99_ms", ("interactive_celery_n", "p99_ms"), False),
        ("batch_gpu_busy", ("batch_celery", "jpeg_800x600", "gpu_busy"), False),
    ):
        a, b = at(one, *path), at(every, *path)
        if a is None or b is None:
            continue
        out[name] = {"one": a, "all": b}
        if ratio and a:
            out[name] |= {"speedup": round(b / a, 3), "of_linear": round(b / (a * n), 3)}
    return out


# -- the report -------------------------------------------------------------------------------------
def markdown(report: dict[str, Any]) -> str:
    env, cfg = report["env"], report["config"]
    lines = [
        f"# End to end — {env['date'][:10]}, {env.get('gpu') or env['cpu']} ({env['device']}), "
        f"{_served(report)}, backend {cfg['backend']}, commit {str(env.get('commit'))[:7]}",
        "",
        _versions_line(env) + (f"; warm-up {report['warmup_s']} s." if "warmup_s" in report else "."),
        *(["", f"Command: `{report['command']}`"] if "command" in report else []),
        *_serving_lines(report),
        "",
        "## Batch jobs (submission to results zip complete)",
        "",
        "| path | workload | items | overlays | images/s (first job) | GPU busy | cores | per item ms: "
        + ", ".join(STAGES)
        + " |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in ("inprocess", "celery"):
        for kind, row in report.get(f"batch_{path}", {}).items():
            st = row["stage_ms_per_item"]
            first = f" ({row['first_images_per_s']})" if "first_images_per_s" in row else ""
            each = _each(row, "images_per_s", "[]")
            busy = "-" if row["gpu_busy"] is None else f"{row['gpu_busy']}{_each(row, 'gpu_busy', '[]')}"
            lines.append(
                f"| {path} | {kind} | {row['items']} ({row['failed']} failed) | {row.get('overlays', '-')} |"
                f" **{row['images_per_s']}**{first}{each} | "
                f"{busy} | {row.get('process_cores', '-')} | "
                + ", ".join(f"{st.get(s, 0):.2f}" for s in STAGES)
                + " |"
            )
    lines += _serial_lines(report)
    par = report.get("decode_parity")
    if par:
        lines += [
            "",
            f"GPU vs CPU decoding on {par['images']} JPEGs: pixels differ by {par['pixel_mean_abs_levels']} levels on"
            f" average; relevance max |Δ| {par['relevance_max_abs_diff']}; top-K overlap {par['top_k_overlap']};"
            f" same top cell {par['top1_same']}/{par['images']}.",
        ]
    eng, after = report.get("engine_alone"), report.get("engine_alone_after")
    if eng:
        again = f"; right after it: **{after['images_per_s']} images/s**" if after else ""
        lines += [
            "",
            f"Engine alone on the same photos, batch {eng['batch']}, before the 800x600 job:"
            f" **{eng['images_per_s']} images/s**{again}.",
        ]
    alone = report.get("stages_alone")
    if alone:
        named = (
            ("decode", "decoding a step's 800x600 photos (pixels and views)"),
            ("decode_pixels", "decoding them without views (a job without overlays)"),
            ("overlays", "drawing and encoding their overlays"),
            ("decode_12mp", "decoding 12 MP photos"),
            ("decode_interactive", "decoding an interactive batch (no views)"),
        )
        why = (
            " A process has one nvJPEG decoder and one encoder, each serving one call at a time."
            if env["device"] == "cuda"
            else ""
        )
        lines += [
            "",
            "Each stage alone on one thread, the same photos, images/s (batch): "
            + "; ".join(
                f"{label} **{alone[k]['images_per_s']}** ({alone[k]['batch']})"
                for k, label in named
                if k in alone
            )
            + "."
            + why,
        ]
    series = report.get("stages_in_series")
    if series:
        lines += [
            "",
            f"The engine, decoding and overlays alone one after another: {series['images_per_s']} images/s;"
            f" the 800x600 job in-process over that: **{series['job_over']}** (above 1: the job overlaps them).",
        ]
    steps = report.get("steps_alone")
    job = report.get("batch_inprocess", {}).get("jpeg_800x600")
    if steps:
        over = (
            f"; the 800x600 job in-process over that: **{round(job['images_per_s'] / steps['images_per_s'], 3)}**"
            if job
            else ""
        )
        lines += [
            "",
            f"The job's steps alone ({steps['batch']} photos each, {steps['in_flight']} in flight as the job runs"
            f" them: decoding, engine, overlays; no files, rows or job store): **{steps['images_per_s']}"
            f" images/s**{over}.",
        ]
    if any(
        len(row.get("rounds", [])) > 1
        for p in ("inprocess", "celery")
        for row in report.get(f"batch_{p}", {}).values()
    ):
        lines += [
            "",
            f"Batch jobs: each run once, then {cfg.get('rounds')} times in a row; the row is the job of median"
            " images/s, the first job in brackets, each timed job's images/s and GPU busy in square brackets.",
        ]
    ratio = report.get("job_over_engine_alone")
    if ratio:
        line = (
            f"The 800x600 job in-process over the engine alone: **{ratio['against_mean']}** against the"
            f" mean of the two, {ratio['against_faster']} against the faster"
        )
        if bare := ratio.get("no_overlays"):
            line += (
                f"; without overlays **{bare['against_mean']}**, {bare['against_faster']} against the faster"
            )
        lines += ["", line + "."]
    peers = report.get("peers")
    if peers:
        lines += [
            "",
            "Peer scripts on the same photos and model (arrcoc.bench.peers; each photo's maps and selected"
            " cells to a Parquet file, no overlays):",
            "",
            *(
                f"- {k}: **{v['images_per_s']} images/s**, {v['rows']} rows. {v.get('does', '')}."
                if "images_per_s" in v
                else f"- {k}: failed: {v.get('error')}"
                for k, v in peers.items()
            ),
        ]
    best = report.get("job_over_best_peer")
    if best:
        off = f", without overlays **{best['no_overlays']}x**" if "no_overlays" in best else ""
        lines += [
            "",
            f"The 800x600 job in-process over the best peer ({best['best_peer']}): **{best['overlays']}x**"
            f" with overlays{off}.",
        ]
    lines += [
        "",
        "cores: this process's CPU time over wall time while it ran (the machine has "
        f"{env['cpu_count']}); in-process, near 1 means the Python threads take turns (the GIL).",
        "",
    ]
    lines += [
        "## Interactive requests",
        "",
        "| path | callers | req/s | p50 ms | p99 ms | cores | mean: caller's check or decode+resize, the batch's GPU decode, engine batch, queue+rest (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in ("inprocess", "celery"):
        for n in ("1", "n"):
            row = report.get(f"interactive_{path}_{n}")
            if row:
                sm = row["stage_ms_mean"]
                each = _each(row, "throughput_rps", "()")
                lines.append(
                    f"| {path} | {row['clients']} | **{row['throughput_rps']}**{each} | {row['p50_ms']} | {row['p99_ms']} | "
                    f"{row.get('process_cores', '-')} | "
                    f"{sm['decode_resize']}, {sm.get('batch_decode') or '-'}, {sm['engine_batch']}, "
                    f"{sm['queue_and_rest']} |"
                )
    if any(len(report.get(f"interactive_{p}_n", {}).get("rounds", [])) > 1 for p in ("inprocess", "celery")):
        lines += [
            "",
            f"Many callers: {cfg.get('rounds')} rounds in a row; the row is the round of median req/s,"
            " each round's req/s in brackets.",
        ]
    lines += _legs_lines(report)
    if "celery_engine_processes" in report:
        lines += [
            "",
            f"Through Celery: a worker group of {_processes(cfg['worker_processes'], 'Celery')} and"
            f" {_processes(report['celery_engine_processes'], 'engine')}; clients in"
            f" {_processes(cfg['client_processes'])}.",
        ]
    lines += _failures_lines(report)
    lines += _devices_lines(report)
    return "\n".join(lines) + "\n"


def _versions_line(env: dict[str, Any]) -> str:
    """The machine and the versions a report's figures depend on, in one line."""
    gpu = (
        f"{env['gpu']} ({env.get('gpu_memory_gb')} GB, driver {env.get('driver')}), "
        if env.get("gpu")
        else ""
    )
    libs = ("torch", "torchvision", "triton", "pyarrow", "pillow", "celery", "redis")
    named = ", ".join(f"{k} {env[k]}" for k in libs if env.get(k))
    return f"{gpu}{env['cpu_count']} CPUs, Python {env.get('python')}, CUDA {env.get('cuda')}, {named}"


def _devices_lines(report: dict[str, Any]) -> list[str]:
    """The worker group over every device beside the one over the first."""
    scaling, every = report.get("device_scaling"), report.get("celery_devices")
    if not scaling or not every:
        return []
    n = scaling["devices"]
    lines = [
        "",
        f"## Several devices: `arrcoc worker --devices {','.join(every['devices'])}`",
        "",
        f"The same worker group per device, over the first device alone and over all {n}; many callers scale"
        " with the devices (the same load per device).",
        "",
        "| | 1 device | all | speedup | of linear |",
        "|---|---|---|---|---|",
    ]
    for name, label in (
        ("batch_images_per_s", "batch job 800x600, images/s"),
        ("interactive_rps", "many callers, req/s"),
    ):
        row = scaling.get(name)
        if row:
            lines.append(
                f"| {label} | {row['one']} | **{row['all']}** | {row['speedup']}x | {row['of_linear']} |"
            )
    for name, label in (
        ("interactive_p99_ms", "many callers, p99 ms"),
        ("batch_gpu_busy", "batch job, GPU busy (mean)"),
    ):
        row = scaling.get(name)
        if row:
            lines.append(f"| {label} | {row['one']} | {row['all']} | | |")
    lines += [
        "",
        f"Over all {n} devices: the batch job has {n} times the items, the callers and client processes are"
        f" {n} times as many.",
    ]
    lines += _failures_lines(every)
    serial = {k: v for k, v in (("one", report.get("batch_celery")), ("all", every.get("batch_celery"))) if v}
    parallel = {k: chunk_phase(v.get("jpeg_800x600")) for k, v in serial.items()}
    if all(parallel.values()) and len(parallel) == 2:
        ratio = parallel["all"] / parallel["one"]
        lines += [
            "",
            f"The job's chunks alone (its wall time less the submission's unpacking and the final assembly of"
            f" results.zip, which one process does once per job): {parallel['one']} images/s on one device,"
            f" {parallel['all']} on all, **{ratio:.2f}x** ({ratio / n:.2f} of linear).",
        ]
    return lines


def _count(n: int, noun: str) -> str:
    """'1 caller', '32 callers', '8 processes'."""
    return f"{n} {noun}{'' if n == 1 else 'es' if noun.endswith('s') else 's'}"


def _processes(n: int, kind: str = "") -> str:
    """'1 engine process', '8 Celery processes'."""
    return _count(n, f"{kind} process".lstrip())


def _legs_lines(report: dict[str, Any]) -> list[str]:
    """Each Celery interactive row's mean split into its legs (`celery_legs`), and its ceiling."""
    lines = []
    for n in ("1", "n"):
        row = report.get(f"interactive_celery_{n}")
        legs = celery_legs(row) if row else None
        if legs:
            who, make = _count(row["clients"], "caller"), "makes" if row["clients"] == 1 else "make"
            lines += [
                "",
                f"Through Celery, {who}: a request's mean of {row['mean_ms']} ms is"
                f" {legs['outside_task_ms']} outside the task (the client's send, Celery's delivery, the"
                f" reply's way back), {legs['around_engine_call_ms']} in the task around the engine call"
                f" and {legs['engine_round_trip_ms']} the engine process's round trip, of which its own"
                f" batch's decode and engine {legs['own_batch_ms']}; with no wait for a batch ahead,"
                f" {who} waiting for each answer {make} at most **{legs['ceiling_rps']:,}"
                " req/s**.",
            ]
    return lines


def _failures_lines(phase: dict[str, Any]) -> list[str]:
    """What failed in a phase's batch jobs and interactive rounds, with the first error, said beside
    its figures (a figure of a run whose items failed is no speed of the work)."""
    said: list[str] = []
    first: str | None = None
    for path in ("inprocess", "celery"):
        for row, job in (phase.get(f"batch_{path}") or {}).items():
            if job.get("failed"):
                said.append(f"{path} batch job {row}: {job['failed']} of {job['items']} items failed")
        for n in ("1", "n"):
            calls = phase.get(f"interactive_{path}_{n}") or {}
            if calls.get("errors"):
                first = first or calls["errors"][0].strip().splitlines()[0]
                said.append(
                    f"{path}, {calls.get('clients', '?')} callers: {calls['requests'] - calls.get('ok', 0)}"
                    f" of {calls['requests']} requests failed"
                )
    if not said:
        return []
    why = f" (first error: {first})" if first else ""
    return ["", f"**Failures**: {'; '.join(said)}{why}."]


def _serial_lines(report: dict[str, Any]) -> list[str]:
    """Per 800x600 job: the work done once per job in one process (unpacking at submission,
    finalizing results.zip), the ceiling it sets, and the chunks' own rate."""
    lines = []
    for path in ("inprocess", "celery"):
        job = report.get(f"batch_{path}", {}).get("jpeg_800x600")
        if not job:
            continue
        serial = once_per_job_ms(job)
        ceiling = f"{1e3 / serial:.0f}" if serial > 0 else "-"
        lines.append(
            f"The 800x600 job, {path}: unpacking and finalizing, done once per job in one process, take"
            f" {serial:.3f} ms an item, a ceiling of {ceiling} images/s however fast its chunks run; the chunks"
            f" alone ran at **{chunk_phase(job)}** images/s."
        )
    return ["", *lines] if lines else []


def once_per_job_ms(job: dict[str, Any]) -> float:
    """A batch job's per-job serial stages (unpacking at submission, finalizing results.zip), in
    ms an item, from the job's own per-item stage times."""
    stages = job.get("stage_ms_per_item", {})
    return stages.get("unpack", 0.0) + stages.get("finalize", 0.0)


def chunk_phase(job: dict[str, Any] | None) -> float | None:
    """A batch job's images/s over its chunks alone: its wall time less its per-job serial stages."""
    if not job:
        return None
    serial_s = once_per_job_ms(job) * job["items"] / 1e3
    return round(job["items"] / max(job["wall_s"] - serial_s, 1e-9), 1)


def _served(report: dict[str, Any]) -> str:
    sv = report.get("serving") or {"variant": report["config"].get("variant", "arrcoc-texture")}
    return f"{sv['variant']}" + (f" {sv['dtype']}" if "dtype" in sv else "")


def _serving_lines(report: dict[str, Any]) -> list[str]:
    """The served model in words: random weights said plainly, and the dtype's parity with float32."""
    sv, lines = report.get("serving"), []
    if not sv:
        return lines
    if sv["random_weights"]:
        lines += [
            "",
            f"**{sv['variant']} with random weights of its real shapes** ({sv['image_size']} px, "
            f"{sv['grid']}x{sv['grid']} cells; weights_version {sv['weights_version']!r}): the same "
            "computation as the real weights, so the same speed; the maps themselves mean nothing.",
        ]
    else:
        lines += [
            "",
            f"{sv['variant']}, weights {sv['weights_version']}, {sv['image_size']} px, served in {sv['dtype']}.",
        ]
    par = report.get("dtype_parity")
    if par:
        lines += [
            "",
            f"{par['dtype']} against float32 (the model's forward in each, on {par['images']} of the photos): "
            f"relevance max |Δ| {par['relevance_max_abs_diff']}, participatory {par['participatory_max_abs_diff']}, "
            f"every map {par['maps_max_abs_diff']}; top-K overlap mean {par['topk_overlap_mean']:.3f}, "
            f"min {par['topk_overlap_min']:.3f}; same top cell {par['top1_same']}/{par['images']}; "
            f"match score max |Δ| {par['match_max_abs_diff']}.",
        ]
    return lines


def _each(row: dict[str, Any], key: str, brackets: str) -> str:
    """Each round's `key` in brackets after a figure, when there was more than one round."""
    rounds = row.get("rounds", [])
    return f" {brackets[0]}{' / '.join(str(r[key]) for r in rounds)}{brackets[1]}" if len(rounds) > 1 else ""


# the batch job runner's stages (jobs/batch.py, host.process), per item; `chunk` is a chunk's whole
# wall time (reading overlaps the others), `write` a step's part and its items recorded,
# `results_zip` its pictures and rows added to the results as it goes, `finalize` finishing results.zip
STAGES = ("unpack", "read", "decode", "engine", "render_encode", "write", "results_zip", "finalize", "chunk")
# the stages that do work (not waits, not the chunk's wall time), one colour each in the plot
WORK_STAGES = {
    "unpack": "#8c564b",
    "decode": "#1f77b4",
    "engine": "#d62728",
    "render_encode": "#ff7f0e",
    "write": "#2ca02c",
    "results_zip": "#9467bd",
    "finalize": "#7f7f7f",
}


def write(report: dict[str, Any], stem: Path) -> list[Path]:
    """stem.json, stem.md and (with matplotlib) stem.png."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    paths[0].write_text(json.dumps(report, indent=1))
    paths[1].write_text(markdown(report))
    if write_png(report, stem.with_suffix(".png")):
        paths.append(stem.with_suffix(".png"))
    return paths


def write_png(report: dict[str, Any], path: Path) -> bool:
    """Three panels: batch jobs' images/s, where a job's time goes per item (by stage), and
    interactive throughput with p50/p99 (needs matplotlib: pip install 'arrcoc[plots]')."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    jobs = [
        (f"{p} {kind}", row)
        for p in ("inprocess", "celery")
        for kind, row in report.get(f"batch_{p}", {}).items()
    ]
    calls = [
        (f"{p}, {report[k]['clients']} caller{'s' if report[k]['clients'] > 1 else ''}", report[k])
        for p in ("inprocess", "celery")
        for k in (f"interactive_{p}_1", f"interactive_{p}_n")
        if k in report
    ]
    every = report.get("celery_devices") or {}  # the same worker group over several devices
    if every:
        on = f"celery on {len(every['devices'])} devices"
        jobs += [(f"{on} {kind}", row) for kind, row in every.get("batch_celery", {}).items()]
        if "interactive_celery_n" in every:
            calls.append(
                (f"{on}, {every['interactive_celery_n']['clients']} callers", every["interactive_celery_n"])
            )
    if not jobs and not calls:
        return False
    env = report["env"]
    fig, (ax_rate, ax_stage, ax_call) = plt.subplots(1, 3, figsize=(17, max(3.5, 0.55 * len(jobs) + 2)))
    names = [n for n, _ in jobs][::-1]
    rows = [r for _, r in jobs][::-1]
    ax_rate.barh(
        names,
        [r["images_per_s"] for r in rows],
        color=["#1f77b4" if n.startswith("in") else "#17becf" for n in names],
    )
    for y, r in enumerate(rows):
        ax_rate.text(r["images_per_s"], y, f" {r['images_per_s']:,.0f}", va="center", fontsize=8)
    eng = report.get("engine_alone")
    ax_rate.set_title(
        "batch jobs: images/s, zip in to results.zip"
        + (f"\n(engine alone: {eng['images_per_s']:,.0f}/s)" if eng else "")
    )
    left = [0.0] * len(rows)
    for stage, colour in WORK_STAGES.items():
        widths = [r["stage_ms_per_item"].get(stage, 0.0) for r in rows]
        ax_stage.barh(names, widths, left=left, color=colour, label=stage)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    wall = [1e3 / r["images_per_s"] for r in rows]
    ax_stage.plot(wall, range(len(rows)), "k|", markersize=18, mew=2.5, label="wall time per item")
    ax_stage.set_title(
        "where a job's time goes, ms per item\n(stages overlap: their sum exceeds the wall time)"
    )
    ax_stage.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=4, frameon=False)
    ax_stage.set_yticks(range(len(rows)), [""] * len(rows))
    labels = [n for n, _ in calls][::-1]
    crows = [r for _, r in calls][::-1]
    ax_call.barh(
        labels,
        [r["throughput_rps"] for r in crows],
        color=["#2ca02c" if n.startswith("in") else "#98df8a" for n in labels],
    )
    for y, r in enumerate(crows):
        ax_call.text(
            r["throughput_rps"],
            y,
            f" {r['throughput_rps']:,.0f}/s  p50 {r['p50_ms']} / p99 {r['p99_ms']} ms",
            va="center",
            fontsize=8,
        )
    ax_call.set_title("interactive requests: req/s")
    for ax in (ax_rate, ax_stage, ax_call):
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.35)
    # room right of the longest bar for its label: its rate, p50 and p99
    ax_call.set_xlim(0, 3.2 * max([r["throughput_rps"] for r in crows], default=1.0))
    fig.suptitle(
        f"End to end: {env.get('gpu') or env['cpu']} ({env['device']}), {_served(report)}, "
        f"backend {report['config']['backend']}, "
        f"commit {str(env.get('commit'))[:7]}, {env['date'][:10]}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


__all__ = ["E2EConfig", "markdown", "percentile", "run_e2e", "workload", "write"]
