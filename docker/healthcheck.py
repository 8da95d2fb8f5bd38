#!/usr/bin/env python3
"""Container healthchecks. `arrcoc-healthcheck worker`: each of this container's worker processes
answers a ping over the broker. `arrcoc-healthcheck demo`: the demo answers HTTP on its port."""

import os
import socket
import sys
import urllib.request


def worker() -> int:
    from celery import Celery

    app = Celery(broker=os.environ.get("ARRCOC_BROKER_URL", "redis://redis:6379/0"))
    app.conf.update(accept_content=["json"], task_serializer="json", result_serializer="json")
    from worker.group import node_name  # no torch: the naming rule only

    n = int(os.environ.get("ARRCOC_WORKER_PROCESSES", "1"))
    name = f"arrcoc@{socket.gethostname()}"
    names = [name] if n <= 1 else [node_name(name, i) for i in range(1, n + 1)]
    replies = app.control.ping(destination=names, timeout=5.0)
    return 0 if len(replies) == len(names) else 1


def demo() -> int:
    port = os.environ.get("GRADIO_SERVER_PORT", "7860")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
        return 0 if r.status == 200 else 1


if __name__ == "__main__":
    try:
        sys.exit({"worker": worker, "demo": demo}[sys.argv[1] if len(sys.argv) > 1 else "worker"]())
    except Exception as e:  # noqa: BLE001 -- any failure is "unhealthy"
        print(f"unhealthy: {e}", file=sys.stderr)
        sys.exit(1)
