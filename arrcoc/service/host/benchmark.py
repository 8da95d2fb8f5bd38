"""Adapter to the engine's benchmark harness (arrcoc.bench), with a small fallback of our own.

The harness is built in arrcoc/bench; until it is importable, the fallback times each backend and
bucket on synthetic inputs so that bench jobs work end to end. Both return one JSON document.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import torch

from ..settings import Settings
from .executor import BenchRequest
from .runtime import Runtime

SCHEMA = "arrcoc.bench.service-fallback/1"


def _harness():
    try:
        from ..bench import BenchConfig, run_benchmark
    except ImportError:
        return None
    return BenchConfig, run_benchmark


def run_benchmark(
    request: BenchRequest, runtime: Runtime, settings: Settings, progress: Callable[[float, str], None] | None = None
) -> dict[str, Any]:
    """The harness's report for `request` (or the fallback's, if arrcoc.bench is absent)."""
    harness = _harness()
    if harness is None:
        return _fallback(request, runtime, settings)
    config_cls, run = harness
    known = {f.name for f in fields(config_cls)}
    kwargs = {"variants": tuple(request.variants), "backends": tuple(request.backends),
              "buckets": tuple(int(b) for b in request.buckets), "iters": request.iterations,
              "warmup_iters": request.warmup, "device": request.device, "dtype": settings.dtype,
              "weights": settings.weights or "default"}  # fmt: skip
    kwargs.update({k: v for k, v in request.options.items() if k in known})
    return run(config_cls(**{k: v for k, v in kwargs.items() if k in known}), progress=progress)


def _fallback(request: BenchRequest, runtime: Runtime, settings: Settings) -> dict[str, Any]:
    from ..engine import create_backend, resolve_device
    from ..registry import create_model, get_variant

    device = resolve_device(request.device)
    rows = []
    for variant in request.variants:
        size = get_variant(variant).image_size
        model = create_model(variant, settings.weights or "default", device)
        for backend_name in request.backends:
            try:
                backend = create_backend(backend_name, model, device, tuple(request.buckets), cache_dir=settings.cache_dir)
                backend.warmup()
            except Exception as e:  # a backend that cannot be built is reported, not fatal
                rows.append({"variant": variant, "backend": backend_name, "error": f"{type(e).__name__}: {e}"})
                continue
            for bucket in request.buckets:
                rows.append(_time_one(backend, variant, bucket, size, request))
            backend.close()
    return {
        "schema": SCHEMA, "created_at": time.time(), "harness": "arrcoc.service.benchrun fallback",
        "device": str(device), "torch": torch.__version__, "python": platform.python_version(),
        "platform": platform.platform(), "request": {"iterations": request.iterations, "warmup": request.warmup},
        "results": rows,
    }  # fmt: skip


def _time_one(backend, variant: str, bucket: int, size: int, request: BenchRequest) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (bucket, 3, size, size), dtype=torch.uint8, generator=g)
    query = torch.nn.functional.normalize(torch.randn(bucket, 384, generator=g), dim=-1)
    sync = torch.cuda.synchronize if backend.device.type == "cuda" else (lambda: None)
    for _ in range(request.warmup):
        backend.run(images, query)
    sync()
    times = []
    for _ in range(max(1, request.iterations)):
        t0 = time.perf_counter()
        backend.run(images, query)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {"variant": variant, "backend": backend.name, "bucket": bucket, "iterations": len(times),
            "mean_ms": round(statistics.fmean(times), 3), "p50_ms": round(p(0.5), 3), "p90_ms": round(p(0.9), 3),
            "p99_ms": round(p(0.99), 3), "images_per_s": round(bucket * 1e3 / statistics.fmean(times), 2)}  # fmt: skip
