"""Where an interactive request's CPU goes through Celery, process by process: the clients, each
Celery worker process, the engine process and redis-server, in CPU ms per request, under load
from concurrent clients. Real redis-server and `arrcoc worker --processes N` started here.

    python tools/celery_cost.py [--clients 16] [--requests 800] [--processes 1] [--device cpu]

On the CPU the engine process's share includes the model; the other shares are what Celery,
Redis and the wire cost, whatever the device. `--canned` puts a stand-in engine process in the
group (this script, serving one result computed at start) so that this 2-core machine can drive
Celery as fast as a GPU would: the engine is the one part that is not real then.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import secrets
import sys
import tempfile
import time
import types
from pathlib import Path

import redis as redis_py

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arrcoc.bench.e2e import QUERIES, workload  # noqa: E402
from arrcoc.bench.load import run_load  # noqa: E402
from arrcoc.bench.processes import Proc, RedisServer, Worker, child_pids, proc_stat, worker_env  # noqa: E402
from arrcoc.service.client.celery_executor import CeleryExecutor  # noqa: E402
from arrcoc.settings import default_settings  # noqa: E402
from worker.group import front_env, plan_engines  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    st = proc_stat(pid)
    return (int(st[11]) + int(st[12])) / _TICK


def _make(url: str, data: str) -> CeleryExecutor:
    return CeleryExecutor(default_settings(service={"broker_url": url, "data_dir": data}))


class _CannedRuntime:
    """What EngineServer asks of a Runtime, answering every request with one precomputed result."""

    max_batch = 16

    def __init__(self, result):
        self.result = result
        self.pipeline = types.SimpleNamespace(device="cuda:0 (canned)")

    def infer(self, image, query, controls, timeout, backend=None):
        return dataclasses.replace(self.result, query=query)


def _serve_canned(address: str, authkey: str) -> None:
    """The stand-in engine process: one real result, computed once, served to every request."""
    from arrcoc.request import Controls
    from arrcoc.service.host.engine_process import EngineServer
    from arrcoc.service.host.runtime import Runtime

    runtime = Runtime(default_settings(engine={"device": "cpu", "backend": "eager"}))
    result = runtime.infer(workload()["jpeg_800x600"][1], QUERIES[0], Controls(), 120)
    runtime.close()
    EngineServer(_CannedRuntime(result), address, bytes.fromhex(authkey)).serve_forever()


def _canned_group(redis_url: str, root: Path, processes: int) -> tuple[list[Proc], list[int], int]:
    """The stand-in engine process and `processes` Celery processes pointed at it, in the
    environments run_group gives its members (worker/group.py)."""
    authkey = secrets.token_bytes(16)
    settings = default_settings(
        service={"broker_url": redis_url, "data_dir": root / "data"},
        engine={"device": "cpu", "backend": "eager"},
    )
    base = worker_env(redis_url, root / "data")
    (spec,) = plan_engines(settings, ["cpu"], 1, root, authkey, base)
    address, env, fronts_env = spec.address, spec.env, front_env(spec, [spec.address], base, settings)
    engine = Proc(
        [sys.executable, __file__, "--serve-canned", address, authkey.hex()], env, root / "engine.log"
    )
    while not os.path.exists(address):
        if not engine.alive():
            raise RuntimeError(engine.text()[-2000:])
        time.sleep(0.2)
    fronts = [
        Proc(
            [sys.executable, "-m", "arrcoc", "worker", "-P", "threads", "-l", "info", "-n", f"canned-{i}@%h"],
            fronts_env,
            root / f"celery-{i}.log",
        )
        for i in range(processes)
    ]
    while sum("serves this worker" in f.text() and "ready" in f.text() for f in fronts) < processes:
        if not all(f.alive() for f in fronts):
            raise RuntimeError([f.text()[-2000:] for f in fronts])
        time.sleep(0.2)
    return [engine, *fronts], [f.p.pid for f in fronts], engine.p.pid


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--client-processes", type=int, default=1)
    p.add_argument("--requests", type=int, default=800)
    p.add_argument("--processes", type=int, default=2, help="Celery processes in the worker group")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="eager")
    p.add_argument("--canned", action="store_true", help="a stand-in engine process (see above)")
    p.add_argument("--serve-canned", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve_canned:
        _serve_canned(*args.serve_canned)
        return 0
    root = Path(tempfile.mkdtemp(prefix="celery-cost-"))
    redis = RedisServer(root / "redis")
    procs: list[Proc] = []
    try:
        if args.canned:
            procs, fronts, engine = _canned_group(redis.url, root, args.processes)
        else:
            env = worker_env(
                redis.url,
                root / "data",
                engine={
                    "device": args.device,
                    "backend": args.backend,
                    "backends": args.backend,
                    "worker_processes": args.processes,
                },
            )
            procs = [Worker(env, root / "worker.log").ready(600)]
            engine, *fronts = child_pids(procs[0].p.pid)
        pids = {"redis-server": [redis.p.pid], "engine process": [engine], "Celery processes": fronts}
        image = workload()["jpeg_800x600"][1]
        before: dict[str, float] = {}

        def on_start() -> None:
            redis_py.Redis(port=redis.port).config_resetstat()
            before.update({k: sum(map(_cpu_s, v)) for k, v in pids.items()})

        t0 = time.perf_counter()
        rep = run_load(
            functools.partial(_make, redis.url, str(root / "data")),
            image,
            QUERIES,
            args.clients,
            args.requests,
            timeout=300,
            processes=args.client_processes,
            on_start=on_start,
        )
        wall = time.perf_counter() - t0
        n = max(rep["ok"], 1)
        print(
            f"{rep['ok']} requests from {args.clients} clients ({len(rep['errors'])} errors {rep['errors'][:2]}): "
            f"{rep['throughput_rps']:.0f} req/s, p50 {rep['p50_ms']} ms, p99 {rep['p99_ms']} ms ({wall:.1f} s)"
        )
        print(f"  {'clients':<18} {rep['client_cpu_ms_per_request']:7.2f} CPU ms a request")
        for k, v in pids.items():
            print(f"  {k:<18} {(sum(map(_cpu_s, v)) - before[k]) * 1e3 / n:7.2f} CPU ms a request")
        print(
            "  the results' own timings (mean ms):",
            {k: round(v, 2) for k, v in rep["timings_ms_mean"].items()},
        )
        stats = redis_py.Redis(port=redis.port).info("commandstats")
        calls = sorted(
            ((v["usec"], k.removeprefix("cmdstat_"), v["calls"]) for k, v in stats.items()), reverse=True
        )
        print(
            "  redis-server, per request:",
            ", ".join(f"{name} {c / n:.2f} calls {us / n:.0f} us" for us, name, c in calls[:12]),
        )
    finally:
        for proc in procs:
            proc.stop()
        redis.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
