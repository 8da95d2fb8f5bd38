"""Timing: interleaved calls, device events on CUDA, perf_counter after sync on CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch


def summarize(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms, dtype=np.float64)
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p90_ms": float(np.percentile(a, 90)),
        "p95_ms": float(np.percentile(a, 95)),
        "p99_ms": float(np.percentile(a, 99)),
        "mean_ms": float(a.mean()),
        "std_ms": float(a.std(ddof=1)) if a.size > 1 else 0.0,
        "min_ms": float(a.min()),
        "iters": int(a.size),
    }


def time_interleaved(
    calls: dict[str, Callable[[int], object]],
    iters: int,
    warmup: int,
    device: torch.device,
    tick: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Call every fn(i) once per iteration, in an order that rotates each iteration so that
    drift (clocks, temperature, other tenants) lands on every backend alike. -> name: [ms]."""
    names = list(calls)
    cuda = device.type == "cuda"
    for i in range(warmup):
        for n in names:
            calls[n](i)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(iters):
        k = i % len(names)
        for n in names[k:] + names[:k]:
            if cuda:
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                calls[n](i)
                end.record()
                end.synchronize()
                times[n].append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                calls[n](i)
                times[n].append((time.perf_counter() - t0) * 1e3)
        if tick is not None:
            tick()
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
