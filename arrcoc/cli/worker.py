"""arrcoc worker: one Celery worker for one device (wraps `celery -A worker.app worker`).

Defaults: the threads pool (dynamic batching gathers concurrent requests in one process), enough
threads for one full batch, queues gpu and bench. Run one per GPU (`--device cuda:N`).
"""

from __future__ import annotations

import os


def add_parser(sub) -> None:
    p = sub.add_parser("worker", help="start a Celery worker that serves the gpu and bench queues")
    p.add_argument("--device", help="cpu | cuda | cuda:N (default: settings, ARRCOC_DEVICE)")
    p.add_argument("--backend", help="eager | compiled | onnx for interactive requests (default: settings)")
    p.add_argument("--queues", "-Q", help="comma-separated (default: the gpu and bench queues)")
    p.add_argument("--pool", "-P", default="threads", choices=("threads", "solo", "prefork"),
                   help="threads (default: needed for dynamic batching), solo, or prefork (one child)")  # fmt: skip
    p.add_argument("--concurrency", "-c", type=int, help="threads (default: batch size + 4)")
    p.add_argument("--processes", type=int,
                   help="Celery processes sharing one engine process on the device (default: ARRCOC_WORKER_PROCESSES"
                        " or 1, the engine inside the worker); several take more requests per second")  # fmt: skip
    p.add_argument("--loglevel", "-l", default="info")
    p.add_argument("--hostname", "-n", default="arrcoc@%h")
    p.add_argument("--broker", help="Redis URL (default: ARRCOC_BROKER_URL or redis://127.0.0.1:6379/0)")
    p.set_defaults(func=run)


def worker_argv(args, settings) -> list[str]:
    from ..service.celery_config import worker_threads

    queues = args.queues or f"{settings.queue_gpu},{settings.queue_bench}"
    concurrency = args.concurrency or (1 if args.pool == "prefork" else worker_threads(settings))
    return ["worker", "-P", args.pool, "-c", str(concurrency), "-Q", queues, "-l", args.loglevel,
            "-n", args.hostname, "-E", "--without-mingle", "--without-gossip"]  # fmt: skip


def run(args) -> int:
    # settings are read from the environment once: set ours before anything imports them
    for flag, env in (("device", "ARRCOC_DEVICE"), ("backend", "ARRCOC_BACKEND"), ("broker", "ARRCOC_BROKER_URL")):
        if getattr(args, flag):
            os.environ[env] = getattr(args, flag)
    os.environ.setdefault("ARRCOC_BROKER_URL", "redis://127.0.0.1:6379/0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..settings import get_settings

    get_settings.cache_clear()
    settings = get_settings()
    processes = args.processes or settings.worker_processes
    if processes > 1 and not settings.engine_socket:
        return _run_group(args, processes)
    from worker.app import app

    argv = worker_argv(args, settings)
    # Celery reads `-P prefork` (its own default) as "not given" and takes worker_pool from the
    # config (threads): set the config itself so every pool choice is honoured
    app.conf.worker_pool = args.pool
    app.conf.worker_concurrency = int(argv[argv.index("-c") + 1])
    app.worker_main(argv)
    return 0


def _run_group(args, processes: int) -> int:
    """The supervisor of `--processes N` (arrcoc.service.worker_group); it never touches the device."""
    import logging

    from ..service.worker_group import run_group

    if args.pool == "prefork":
        raise SystemExit("--processes runs threads-pool workers around one engine process; drop -P prefork")
    logging.basicConfig(level=args.loglevel.upper(), format="[%(asctime)s: %(levelname)s/group] %(message)s")
    front = ["-P", args.pool, "-l", args.loglevel]
    for flag, value in (("-Q", args.queues), ("-c", args.concurrency)):
        if value:
            front += [flag, str(value)]
    return run_group(processes, front, args.hostname)
