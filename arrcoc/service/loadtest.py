"""N concurrent clients calling Executor.infer: throughput, latency percentiles, batch sizes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .executor import Executor


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def run_load(
    ex: Executor, image: bytes, queries: Sequence[str], clients: int, requests: int, timeout: float = 300.0
) -> dict[str, Any]:
    """`requests` inferences from `clients` threads, each sending its next one when the last returns."""
    latencies: list[float] = []
    buckets: Counter[int] = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    counter = iter(range(requests))
    ex.infer(image, queries[0], timeout=timeout)  # warm: engine built, query encoder loaded

    def client() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t0 = time.perf_counter()
            try:
                r = ex.infer(image, queries[i % len(queries)], timeout=timeout)
            except Exception as e:  # noqa: BLE001 -- counted and reported
                with lock:
                    errors.append(f"{type(e).__name__}: {e}")
                continue
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt * 1e3)
                buckets[int(r.bucket or 0)] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients, "requests": requests, "ok": len(latencies), "errors": errors[:10],
        "wall_s": round(wall, 3), "throughput_rps": round(len(latencies) / wall, 3),
        "p50_ms": round(percentile(latencies, 0.50), 1), "p90_ms": round(percentile(latencies, 0.90), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1), "mean_ms": round(sum(latencies) / max(len(latencies), 1), 1),
        "max_ms": round(max(latencies, default=float("nan")), 1),
        "buckets": {str(k): v for k, v in sorted(buckets.items())},
    }  # fmt: skip
