#!/usr/bin/env python3
"""Container healthchecks. `arrcoc-healthcheck worker`: each of this container's Celery processes
answers a ping over the broker and reports nothing that stops it serving (a model that cannot
load, a job data directory it cannot read: printed), and, in a worker group, every engine process
(every device's) answers one of them. `arrcoc-healthcheck demo`: the demo answers HTTP on its port
and, with a broker (ARRCOC_SERVICE__BROKER_URL), a worker answers a ping over it."""

import os
import socket
import sys
import urllib.request


def worker() -> int:
    from celery import Celery

    app = Celery(broker=os.environ.get("ARRCOC_SERVICE__BROKER_URL", "redis://redis:6379/0"))
    app.conf.update(accept_content=["json"], task_serializer="json", result_serializer="json")
    from worker.group import count_gpus, node_name  # no torch here: the naming and counting rules

    processes = int(os.environ.get("ARRCOC_ENGINE__WORKER_PROCESSES", "1"))
    # a worker group or one Celery process, as `arrcoc worker` decides
    grouped = processes > 1 or bool(os.environ.get("ARRCOC_ENGINE__DEVICES", "").strip())
    name = f"arrcoc@{socket.gethostname()}"
    names = (
        [node_name(name, i) for i in range(1, processes * _devices(count_gpus) + 1)] if grouped else [name]
    )
    # it returns once every process has answered: the timeout waits only for a slow or missing one
    replies = app.control.ping(destination=names, timeout=10.0)
    if len(replies) != len(names):
        print(f"unhealthy: {len(replies)} of {len(names)} Celery processes answered", file=sys.stderr)
        return 1
    # a process that answers may still be unable to serve: its model did not load, or it cannot
    # read the jobs' data directory (worker/state.py)
    health = app.control.broadcast("arrcoc_health", destination=names, reply=True, timeout=10.0)
    problems = [f"{node}: {p}" for reply in health for node, ps in reply.items() for p in ps]
    if problems:
        print("unhealthy: " + "; ".join(problems), file=sys.stderr)
        return 1
    if not grouped:
        return 0  # the engine is inside the one Celery process that answered
    engines = app.control.broadcast("arrcoc_engines", destination=names[:1], reply=True, timeout=10.0)
    down = [e for reply in engines for e in next(iter(reply.values())) if not e.get("up")]
    if not engines or down:
        print(f"unhealthy: engine processes not answering: {down or 'no reply'}", file=sys.stderr)
        return 1
    return 0


def _devices(count_gpus) -> int:
    """How many devices the worker group serves (ARRCOC_ENGINE__DEVICES: all, counted as the group counts
    them, or a list)."""
    devices = [d for d in os.environ.get("ARRCOC_ENGINE__DEVICES", "").split(",") if d.strip()]
    return count_gpus(os.environ) if devices == ["all"] else max(len(devices), 1)


def demo() -> int:
    port = os.environ.get("GRADIO_SERVER_PORT", "7860")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
        if r.status != 200:
            return 1
    broker = os.environ.get("ARRCOC_SERVICE__BROKER_URL")
    if not broker:
        return 0  # the in-process executor: the demo serves alone
    from celery import Celery

    # without a worker every request waits and fails, and jobs never start
    if not Celery(broker=broker).control.ping(timeout=5.0):
        print(f"unhealthy: no worker answered a ping over {broker}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit({"worker": worker, "demo": demo}[sys.argv[1] if len(sys.argv) > 1 else "worker"]())
    except Exception as e:  # noqa: BLE001 -- any failure is "unhealthy"
        print(f"unhealthy: {e}", file=sys.stderr)
        sys.exit(1)
