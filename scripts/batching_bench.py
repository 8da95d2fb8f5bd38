#!/usr/bin/env python3
"""Dynamic batching on vs off through the real Celery path: throughput and p50/p99 latency.

Starts its own redis-server (compose's persistence settings) and one `arrcoc worker` per round
(same thread count both ways; "off" is ARRCOC_BATCH_MAX_SIZE=1), drives it with N concurrent
clients calling CeleryExecutor.infer, and writes benchmarks/batching-<device>-<date>.{json,md}.

    .venv/bin/python scripts/batching_bench.py --clients 32 --requests 128 --rounds 2
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from arrcoc.cli.submit import LOADTEST_QUERIES  # noqa: E402
from arrcoc.service.loadtest import run_load  # noqa: E402
from arrcoc.service.testing import RedisServer, Worker, worker_env  # noqa: E402
from arrcoc.settings import default_settings  # noqa: E402


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (a worker group's engine and
    Celery processes) so far (Linux /proc; the warm-up request included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(process_cpu_s(int(c)) for c in children)


def one_round(mode: str, args, root: Path, redis: RedisServer) -> dict:
    threads = (
        -(-args.clients // (args.workers * args.processes)) + 4
    )  # every client's request can be in flight
    settings = {"device": args.device, "backend": args.backend, "backends": args.backend,
                "batch_max_size": str(args.max_batch if mode == "on" else 1),
                "batch_max_delay_ms": str(args.delay_ms), "worker_threads": str(threads),
                "worker_processes": str(args.processes)}  # fmt: skip
    env = worker_env(redis.url, root / "data", **settings)
    workers = [Worker(env, root / f"worker-{mode}-{i}-{time.time():.0f}.log") for i in range(args.workers)]
    try:
        for w in workers:
            w.ready(300)
        from arrcoc.service.celery_executor import CeleryExecutor

        make_executor = functools.partial(CeleryExecutor, default_settings(broker_url=redis.url, data_dir=root / "data"))
        load0 = os.getloadavg()[0]
        cpu0 = sum(process_cpu_s(w.p.pid) for w in workers)
        report = run_load(make_executor, args.image.read_bytes(), LOADTEST_QUERIES, args.clients, args.requests,
                          args.timeout, args.client_processes)  # fmt: skip
        cpu = sum(process_cpu_s(w.p.pid) for w in workers) - cpu0
        report["worker_cpu_ms_per_request"] = round(cpu * 1e3 / max(report["ok"], 1), 2)
        report.update(mode=mode, workers=args.workers, processes=args.processes, max_batch=int(settings["batch_max_size"]), delay_ms=args.delay_ms,
                      loadavg_1m_before=round(load0, 2), loadavg_1m_after=round(os.getloadavg()[0], 2))  # fmt: skip
        keys = ("mode", "throughput_rps", "p50_ms", "p99_ms", "buckets", "client_cpu_ms_per_request",
                "worker_cpu_ms_per_request", "timings_ms_mean")  # fmt: skip
        print(json.dumps({k: report[k] for k in keys}), flush=True)
        return report
    finally:
        for w in workers:
            w.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=128, help="per round")
    p.add_argument("--rounds", type=int, default=2, help="off/on pairs, interleaved")
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--delay-ms", type=float, default=5.0)
    p.add_argument("--client-processes", type=int, default=1,
                   help="processes the clients are spread over: one Python process's GIL caps its threads")  # fmt: skip
    p.add_argument("--device", default="cpu")
    p.add_argument("--backend", default="eager", help="the backend the worker serves")
    p.add_argument("--workers", type=int, default=1,
                   help="`arrcoc worker` processes on the one device (each batches its own requests)")  # fmt: skip
    p.add_argument("--processes", type=int, default=1,
                   help="Celery processes per worker sharing its engine process (`arrcoc worker --processes`)")  # fmt: skip
    p.add_argument("--image", type=Path, default=REPO / "arrcoc" / "examples" / "coffee.jpg")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks")
    args = p.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="arrcoc-batching-") as tmp:
        root = Path(tmp)
        redis = RedisServer(root / "redis")
        try:
            for _ in range(args.rounds):
                for mode in ("off", "on"):
                    rounds.append(one_round(mode, args, root, redis))
        finally:
            redis.stop()
    summary = {}
    for mode in ("off", "on"):
        rs = [r for r in rounds if r["mode"] == mode]
        summary[mode] = {k: round(statistics.median(r[k] for r in rs), 2) for k in ("throughput_rps", "p50_ms", "p99_ms")}
    summary["throughput_ratio"] = round(summary["on"]["throughput_rps"] / summary["off"]["throughput_rps"], 2)
    summary["p99_ratio_on_over_off"] = round(summary["on"]["p99_ms"] / summary["off"]["p99_ms"], 3)
    import torch

    commit = os.environ.get("ARRCOC_COMMIT") or subprocess.run(  # the GPU machine's copy has no .git
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    doc = {"schema": "arrcoc.batching-bench/1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": "python " + " ".join([str(Path(sys.argv[0]).relative_to(REPO) if Path(sys.argv[0]).is_absolute() else sys.argv[0]), *sys.argv[1:]]),
           "commit": commit, "device": args.device, "cpus": os.cpu_count(), "platform": platform.platform(),
           "torch": torch.__version__, "clients": args.clients, "requests_per_round": args.requests,
           "backend": args.backend, "workers": args.workers, "processes": args.processes, "client_processes": args.client_processes, "max_batch": args.max_batch, "delay_ms": args.delay_ms, "image": args.image.name,
           "summary": summary, "rounds": rounds}  # fmt: skip
    suffix = (f"-w{args.workers}" if args.workers > 1 else "") + (
        f"-p{args.processes}" if args.processes > 1 else ""
    )
    stem = (
        args.out
        / f"batching-{args.device}-{time.strftime('%Y%m%d', time.gmtime())}-b{args.max_batch}{suffix}"
    )
    n = 1
    while stem.with_suffix(".json").exists() or stem.with_suffix(".md").exists():  # never overwrite a report
        n += 1
        stem = stem.with_name(f"{stem.name.rsplit('-run', 1)[0]}-run{n}")
    args.out.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown(doc))
    print(json.dumps(summary, indent=2))
    return 0


def markdown(doc: dict) -> str:
    s = doc["summary"]
    lines = [
        f"# Dynamic batching on {doc['device']}: {doc['clients']} concurrent clients through Celery",
        "",
        f"{doc['date']}, commit {doc['commit']}, {doc['cpus']} CPUs ({doc['platform']}), torch {doc['torch']}.",
        f"Each round: {doc.get('workers', 1)} fresh `arrcoc worker --processes {doc.get('processes', 1)}`"
        f" ({doc.get('backend', 'eager')} backend, threads pool"
        + (", Celery processes sharing one engine process" if doc.get("processes", 1) > 1 else "") + ") on one redis-server;",
        f"{doc['requests_per_round']} requests of `{doc['image']}` from {doc['clients']} client threads"
        f" (in {doc.get('client_processes', 1)} processes) calling",
        "`CeleryExecutor.infer` back to back. Off = `ARRCOC_BATCH_MAX_SIZE=1`; on = max batch"
        f" {doc['max_batch']}, max queue delay {doc['delay_ms']} ms. Medians over the rounds.",
        "",
        "| batching | throughput (req/s) | p50 (ms) | p99 (ms) |",
        "|---|---:|---:|---:|",
        *(f"| {m} | {s[m]['throughput_rps']} | {s[m]['p50_ms']} | {s[m]['p99_ms']} |" for m in ("off", "on")),
        "",
        f"**Throughput ratio on/off: {s['throughput_ratio']}x**; p99 on/off: {s['p99_ratio_on_over_off']}.",
        "",
        "Rounds (batch size histogram is the engine bucket each result reports):",
        "",
        "| # | batching | req/s | p50 | p99 | buckets | CPU ms/request client, worker (task thread, batch thread) |"
        " load avg before/after |",
        "|---|---|---:|---:|---:|---|---|---|",
        *(f"| {i} | {r['mode']} | {r['throughput_rps']} | {r['p50_ms']} | {r['p99_ms']} | {r['buckets']} |"
          f" {r.get('client_cpu_ms_per_request', '–')}, {r.get('worker_cpu_ms_per_request', '–')}"
          f" ({r.get('timings_ms_mean', {}).get('task_cpu_ms', '–')}, {r.get('timings_ms_mean', {}).get('batch_cpu_ms', '–')}) |"
          f" {r['loadavg_1m_before']}/{r['loadavg_1m_after']} |" for i, r in enumerate(doc["rounds"], 1)),
        "",
        "Reproduce:",
        "",
        "```",
        doc["command"],
        "```",
        "",
        "The machine is shared (other jobs ran at the same time: see the load averages), so absolute",
        "numbers are noisy; the ratio of interleaved rounds is the figure to read.",
        "",
    ]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
