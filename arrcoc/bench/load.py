"""N concurrent clients calling Executor.infer: throughput, latency percentiles, batch sizes.

Clients are threads, spread over one or more client processes: one Python process's GIL caps
what its threads can send (a few ms of client CPU per request through Celery), so measuring a fast server needs several, as real clients would be.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..service.client.executor import Executor

ExecutorFactory = Callable[[], Executor]  # picklable (a module-level function or a partial of one)


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass
class _Sample:
    latencies: list[float] = field(default_factory=list)  # ms
    buckets: Counter[int] = field(default_factory=Counter)
    timings: Counter[str] = field(default_factory=Counter)  # sums of the results' timings_ms
    errors: list[str] = field(default_factory=list)
    start: float = 0.0  # time.time() of the first request and after the last answer
    end: float = 0.0
    cpu_s: float = 0.0  # this client process's CPU


def _drive(
    ex: Executor, image: bytes, queries: Sequence[str], clients: int, requests: int, timeout: float
) -> _Sample:
    """`requests` inferences from `clients` threads, each sending its next one when the last returns."""
    out = _Sample()
    lock = threading.Lock()
    counter = iter(range(requests))

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
                    out.errors.append(f"{type(e).__name__}: {e}")
                continue
            dt = time.perf_counter() - t0
            with lock:
                out.latencies.append(dt * 1e3)
                out.buckets[int(r.bucket or 0)] += 1
                out.timings.update(r.timings_ms)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    cpu0 = _cpu_seconds()
    out.start = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.end = time.time()
    out.cpu_s = _cpu_seconds() - cpu0
    return out


def _client_process(
    make_executor: ExecutorFactory,
    image: bytes,
    queries: Sequence[str],
    clients: int,
    requests: int,
    timeout: float,
    ready,
    go,
    results,
) -> None:
    ex = make_executor()
    signalled = False
    try:
        ex.infer(image, queries[0], timeout=timeout)  # connections up before the clock starts
        ready.put(True)
        signalled = True
        go.wait()
        results.put(_drive(ex, image, queries, clients, requests, timeout))
    except BaseException as e:  # noqa: BLE001 -- the parent reports it
        results.put(_Sample(errors=[f"client process: {type(e).__name__}: {e}"]))
        if not signalled:
            ready.put(False)
    finally:
        ex.close()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (i < total % parts) for i in range(parts)]


def run_load(
    make_executor: ExecutorFactory,
    image: bytes,
    queries: Sequence[str],
    clients: int,
    requests: int,
    timeout: float = 300.0,
    processes: int = 1,
    on_start: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Drive `requests` inferences from `clients` concurrent clients in `processes` processes.
    `on_start` is called as the clock starts (clients connected and warm), e.g. to sample CPU."""
    processes = max(1, min(processes, clients))
    if processes == 1:
        ex = make_executor()
        try:
            ex.infer(image, queries[0], timeout=timeout)  # warm: engine built, query encoder loaded
            if on_start:
                on_start()
            samples = [_drive(ex, image, queries, clients, requests, timeout)]
        finally:
            ex.close()
    else:
        ctx = mp.get_context("spawn")  # fresh interpreters: no inherited sockets or threads
        ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [
            ctx.Process(
                target=_client_process,
                daemon=True,
                args=(make_executor, image, queries, c, n, timeout, ready, go, results),
            )
            for c, n in zip(_split(clients, processes), _split(requests, processes), strict=True)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=timeout)
        go.set()
        if on_start:
            on_start()
        samples = [results.get(timeout=timeout + 60) for _ in procs]
        for p in procs:
            p.join(10)
    return _report(samples, clients, requests, processes)


def _report(samples: list[_Sample], clients: int, requests: int, processes: int) -> dict[str, Any]:
    latencies = [x for s in samples for x in s.latencies]
    buckets = sum((s.buckets for s in samples), Counter())
    timings = sum((s.timings for s in samples), Counter())
    ran = [s for s in samples if s.end]
    wall = max(s.end for s in ran) - min(s.start for s in ran) if ran else float("nan")
    return {
        "clients": clients,
        "client_processes": processes,
        "requests": requests,
        "ok": len(latencies),
        "errors": [e for s in samples for e in s.errors][:10],
        "wall_s": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 3),
        "p50_ms": round(percentile(latencies, 0.50), 1),
        "p90_ms": round(percentile(latencies, 0.90), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "mean_ms": round(sum(latencies) / max(len(latencies), 1), 1),
        "max_ms": round(max(latencies, default=float("nan")), 1),
        "buckets": {str(k): v for k, v in sorted(buckets.items())},
        # if this approaches processes x 1000 ms per second of wall time, the clients are the bottleneck
        "client_cpu_ms_per_request": round(sum(s.cpu_s for s in samples) * 1e3 / max(len(latencies), 1), 2),
        # the server's own accounting, mean per request (e.g. task_cpu_ms, batch_cpu_ms, model_ms)
        "timings_ms_mean": {k: round(v / max(len(latencies), 1), 3) for k, v in sorted(timings.items())},
    }


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
