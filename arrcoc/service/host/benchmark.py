"""A benchmark job's request -> the benchmark harness (arrcoc.bench) -> its JSON report."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from ...bench import BenchConfig
from ...bench import run_benchmark as run_harness
from ...settings import Settings
from ..jobs.types import BenchRequest
from .interface import Progress


def run_benchmark(
    request: BenchRequest, settings: Settings, progress: Progress | None = None
) -> dict[str, Any]:
    """The harness's report for `request`; options the harness does not know are ignored."""
    known = {f.name for f in fields(BenchConfig)}
    kwargs = {
        "variants": tuple(request.variants),
        "backends": tuple(request.backends),
        "buckets": tuple(int(b) for b in request.buckets),
        "iters": request.iterations,
        "warmup_iters": request.warmup,
        "device": request.device,
        # options may name one
        "dtype": "float32" if settings.engine.dtype == "auto" else settings.engine.dtype,
        "weights": settings.engine.weights or "default",
    }
    kwargs.update({k: v for k, v in request.options.items() if k in known})
    return run_harness(BenchConfig(**{k: v for k, v in kwargs.items() if k in known}), progress=progress)
