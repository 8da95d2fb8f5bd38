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

from arrcoc.bench.load import run_load  # noqa: E402
from arrcoc.bench.processes import RedisServer, Worker, child_pids, proc_stat, worker_env  # noqa: E402
from arrcoc.cli.submit import LOADTEST_QUERIES  # noqa: E402
from arrcoc.settings import default_settings  # noqa: E402


def own_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (Linux /proc)."""
    fields = proc_stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants (a worker group's engine and Celery
    processes) so far."""
    return own_cpu_s(pid) + sum(process_cpu_s(c) for c in child_pids(pid))


def cpu_by_role(worker_pids: list[int], redis_pid: int) -> dict[str, float]:
    """CPU seconds so far of the engine process(es), the Celery processes (supervisor included) and
    redis-server: where a worker's CPU goes."""
    out = {"engine": 0.0, "celery": 0.0, "redis": process_cpu_s(redis_pid)}
    for pid in worker_pids:
        out["celery"] += own_cpu_s(pid)
        for c in child_pids(pid):
            role = "engine" if b"engine_process" in Path(f"/proc/{c}/cmdline").read_bytes() else "celery"
            out[role] += process_cpu_s(c)
    return out


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs since boot (/proc/stat): their ratio over a round says
    whether the machine, rather than one process, was the limit."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v) - idle, sum(v)


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
        from arrcoc.service.client.celery_executor import CeleryExecutor

        make_executor = functools.partial(CeleryExecutor, default_settings(broker_url=redis.url, data_dir=root / "data"))
        load0 = os.getloadavg()[0]
        pids = [w.p.pid for w in workers]
        start = {}  # CPU counters as the clients start sending (their start-up excluded)

        def on_start() -> None:
            start.update(cpu=cpu_by_role(pids, redis.p.pid), busy=machine_busy())

        report = run_load(make_executor, args.image.read_bytes(), LOADTEST_QUERIES, args.clients, args.requests,
                          args.timeout, args.client_processes, on_start)  # fmt: skip
        cpu1, busy1 = cpu_by_role(pids, redis.p.pid), machine_busy()
        cpu0, busy0 = start["cpu"], start["busy"]
        per_request = {k: round((cpu1[k] - cpu0[k]) * 1e3 / max(report["ok"], 1), 2) for k in cpu0}
        report["worker_cpu_ms_per_request"] = round(per_request["engine"] + per_request["celery"], 2)
        report["cpu_ms_per_request"] = {"client": report["client_cpu_ms_per_request"], **per_request}
        report["machine_busy"] = round((busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1), 3)
        report.update(mode=mode, workers=args.workers, processes=args.processes, max_batch=int(settings["batch_max_size"]), delay_ms=args.delay_ms,
                      loadavg_1m_before=round(load0, 2), loadavg_1m_after=round(os.getloadavg()[0], 2))  # fmt: skip
        keys = ("mode", "throughput_rps", "p50_ms", "p99_ms", "buckets", "client_cpu_ms_per_request",
                "cpu_ms_per_request", "machine_busy", "timings_ms_mean")  # fmt: skip
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


def _cpu_cell(r: dict) -> str:
    c = r.get("cpu_ms_per_request")
    if c is None:  # reports from before the split
        return f"{r.get('client_cpu_ms_per_request', '–')}, worker {r.get('worker_cpu_ms_per_request', '–')}"
    return f"{c['client']}, {c['celery']}, {c['engine']}, {c['redis']}"


def _latency_cell(r: dict) -> str:
    t = r.get("timings_ms_mean", {})
    if "task_wall_ms" not in t:
        return "–"
    task = t["task_wall_ms"]
    engine = f" ({t['engine_wall_ms']:.1f})" if "engine_wall_ms" in t else ""
    return f"{r['mean_ms']} = {r['mean_ms'] - task:.1f} + {task:.1f}{engine}"


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
        "| # | batching | req/s | p50 | p99 | buckets | CPU ms/request: clients, Celery, engine, redis | machine busy |"
        " mean ms: latency = outside the task + task (engine round trip) |",
        "|---|---|---:|---:|---:|---|---|---:|---|",
        *(f"| {i} | {r['mode']} | {r['throughput_rps']} | {r['p50_ms']} | {r['p99_ms']} | {r['buckets']} |"
          f" {_cpu_cell(r)} | {r.get('machine_busy', '–')} | {_latency_cell(r)} |" for i, r in enumerate(doc["rounds"], 1)),
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
