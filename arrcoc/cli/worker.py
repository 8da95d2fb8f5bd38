"""arrcoc worker: one Celery worker for one device (wraps `celery -A worker.app worker`).

Defaults: the threads pool (dynamic batching gathers concurrent requests in one process), enough
threads for one full batch, queues gpu and bench. Run one per GPU (`--device cuda:N`). The CLI's
options become the worker's settings, passed to the app (`worker.app.configure`), not written
into the environment.
"""

from __future__ import annotations

from ..settings import BACKENDS, DEFAULT_BROKER_URL, DTYPES


def add_parser(sub) -> None:
    p = sub.add_parser("worker", help="start a Celery worker that serves the gpu and bench queues")
    p.add_argument("--device", help="cpu | cuda | cuda:N (default: settings, ARRCOC_ENGINE__DEVICE)")
    p.add_argument(
        "--devices",
        help="a worker group over several devices: all (every visible GPU) or a list such as cuda:0,cuda:1;"
        " one engine process (ARRCOC_ENGINE__PROCESSES) and --processes Celery processes per device"
        " (default: ARRCOC_ENGINE__DEVICES)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        help="for interactive requests (default: settings, ARRCOC_ENGINE__BACKEND)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="auto: bfloat16 for CLIP on a GPU, else float32; float32: float32 everywhere (ARRCOC_ENGINE__DTYPE)",
    )
    p.add_argument("--queues", "-Q", help="comma-separated (default: the gpu and bench queues)")
    p.add_argument(
        "--pool",
        "-P",
        default="threads",
        choices=("threads", "solo", "prefork"),
        help="threads (default: needed for dynamic batching), solo, or prefork (one child)",
    )
    p.add_argument("--concurrency", "-c", type=int, help="threads (default: batch size + 4)")
    p.add_argument(
        "--processes",
        type=int,
        help="Celery processes per device feeding the group's engine processes (default:"
        " ARRCOC_ENGINE__WORKER_PROCESSES or 1, the engine inside the worker); several take more requests per"
        " second",
    )
    p.add_argument("--loglevel", "-l", default="info")
    p.add_argument("--hostname", "-n", default="arrcoc@%h")
    p.add_argument(
        "--broker", help=f"Redis URL (default: ARRCOC_SERVICE__BROKER_URL or {DEFAULT_BROKER_URL})"
    )
    p.set_defaults(func=run)


def worker_settings(args):
    """The settings from the environment, with this command's options on top."""
    from ..settings import get_settings

    s = get_settings()
    engine = {"device": args.device, "backend": args.backend, "dtype": args.dtype, "devices": args.devices}
    # validated as the environment's values are (--devices as ARRCOC_ENGINE__DEVICES)
    return s.replace(
        engine={k: v for k, v in engine.items() if v},
        service={"broker_url": args.broker or s.service.queue_url},
    )


def worker_argv(args, settings) -> list[str]:
    from worker.config import worker_threads

    queues = args.queues or f"{settings.service.queue_gpu},{settings.service.queue_bench}"
    concurrency = args.concurrency or (1 if args.pool == "prefork" else worker_threads(settings))
    return [
        "worker",
        "-P",
        args.pool,
        "-c",
        str(concurrency),
        "-Q",
        queues,
        "-l",
        args.loglevel,
        "-n",
        args.hostname,
        "--without-mingle",
        "--without-gossip",
    ]


def run(args) -> int:
    from ..service.host.wiring import Wiring

    settings = worker_settings(args)
    processes = args.processes or settings.engine.worker_processes
    if (processes > 1 or settings.engine.devices) and not Wiring.from_env().in_group:
        return _run_group(args, processes, settings)
    from worker.app import app, configure

    configure(settings)
    argv = worker_argv(args, settings)
    # Celery reads `-P prefork` (its own default) as "not given" and takes worker_pool from the
    # config (threads): set the config itself so every pool choice is honoured
    app.conf.worker_pool = args.pool
    app.conf.worker_concurrency = int(argv[argv.index("-c") + 1])
    app.worker_main(argv)
    return 0


def _run_group(args, processes: int, settings) -> int:
    """The supervisor of `--processes N` / `--devices` (worker/group.py); it never touches a device."""
    import logging

    from worker.group import run_group

    if args.pool == "prefork":
        raise SystemExit(
            "--processes/--devices run threads-pool workers around engine processes; drop -P prefork"
        )
    logging.basicConfig(level=args.loglevel.upper(), format="[%(asctime)s: %(levelname)s/group] %(message)s")
    # the group's members are new processes: this command's options reach them as options (the
    # Celery processes) and as their settings' environment (the engine process)
    front = ["-P", args.pool, "-l", args.loglevel]
    for flag, value in (
        ("-Q", args.queues),
        ("-c", args.concurrency),
        ("--device", args.device),
        ("--backend", args.backend),
        ("--broker", settings.service.broker_url),
    ):
        if value:
            front += [flag, str(value)]
    return run_group(processes, front, args.hostname, settings)
