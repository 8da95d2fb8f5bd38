"""`arrcoc worker --processes N`: engine processes and N Celery worker processes on one device.

This supervisor never touches the device. It starts the engine process (ARRCOC_ENGINE_PROCESSES:
several, one after another, so each later one warms from the compile cache the first filled),
waits until each listens, then starts the Celery processes, the i-th pointed at engine process
i mod E (see engine_process.py for why). The group lives
and dies together: if any member exits, the others are stopped and the supervisor exits non-zero
(compose or systemd restarts it; unacknowledged tasks are redelivered). Members get SIGKILL from
the kernel if the supervisor itself is killed, so a killed worker leaves no orphans behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Client
from pathlib import Path

from arrcoc.settings import Settings

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec (Linux)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _wait_listening(engine: subprocess.Popen, address: str, authkey: bytes, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if engine.poll() is not None:
            raise RuntimeError(f"the engine process exited with code {engine.returncode} before it was ready")
        if os.path.exists(address):
            with contextlib.suppress(OSError):
                Client(address, family="AF_UNIX", authkey=authkey).close()
                return
        time.sleep(0.2)
    raise RuntimeError(f"the engine process did not listen within {timeout:.0f} s")


def node_name(hostname: str, i: int) -> str:
    """Celery node names of the group's processes: arrcoc@%h -> arrcoc-1@%h, ..."""
    name, at, host = hostname.partition("@")
    return f"{name}-{i}{at}{host}"


def member_envs(settings: Settings, address: str, authkey: bytes, base: Mapping[str, str],
                group: Sequence[str] = ()) -> tuple[dict[str, str], dict[str, str]]:  # fmt: skip
    """The environments of one of a group's engine processes (listening on `address`, one of
    `group`'s) and of the Celery processes it serves, from `base`."""
    env = dict(base, ARRCOC_ENGINE_SOCKET=address, ARRCOC_ENGINE_AUTHKEY=authkey.hex(),
               ARRCOC_ENGINE_GROUP=",".join(group or [address]),
               ARRCOC_WORKER_PROCESSES="1", ARRCOC_DEVICE=settings.device, ARRCOC_BACKEND=settings.backend, ARRCOC_DTYPE=settings.dtype,
               ARRCOC_BROKER_URL=settings.queue_url)  # fmt: skip
    # OpenMP (torch's CPU threads) reads these at start-up. Idle OpenMP threads spin by default,
    # burning cores the other processes need; the Celery processes run no model, only small
    # copies, so one thread each (torch.set_num_threads would apply to the calling thread only).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    front_env = dict(env)
    front_env.setdefault("OMP_NUM_THREADS", "1")
    return env, front_env


def run_group(processes: int, front_args: list[str], hostname: str, settings: Settings,
              ready_timeout: float = 1800.0) -> int:  # fmt: skip
    """Run the group until a signal or a member's exit; returns the exit code. The members are new
    processes: they read `settings` from the environment they are started with."""
    sock_dir = Path(tempfile.mkdtemp(prefix="arrcoc-engine-"))
    addresses = [str(sock_dir / f"engine-{i}.sock") for i in range(min(settings.engine_processes, processes))]
    authkey = secrets.token_bytes(16)
    envs = [member_envs(settings, address, authkey, os.environ, addresses) for address in addresses]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    engines: list[subprocess.Popen] = []
    fronts: list[subprocess.Popen] = []  # the Celery processes
    code = 0
    try:
        for address, (env, _) in zip(addresses, envs, strict=True):
            engine = subprocess.Popen([sys.executable, "-m", "arrcoc.service.host.engine_process"], env=env,
                                      preexec_fn=_die_with_parent)  # fmt: skip
            engines.append(engine)
            _wait_listening(engine, address, authkey, ready_timeout)
        for i in range(1, processes + 1):
            argv = [sys.executable, "-m", "arrcoc", "worker", *front_args, "-n", node_name(hostname, i)]
            front_env = envs[(i - 1) % len(envs)][1]
            fronts.append(subprocess.Popen(argv, env=front_env, preexec_fn=_die_with_parent))
        log.info("worker group: engine processes %s, Celery processes %s", [p.pid for p in engines],
                 [p.pid for p in fronts])  # fmt: skip
        while not stop.wait(0.5):
            ended = next((p for p in engines + fronts if p.poll() is not None), None)
            if ended is not None:
                log.error(
                    "worker group: process %d exited with code %s; stopping the group",
                    ended.pid,
                    ended.returncode,
                )
                code = ended.returncode or 1
                break
    except RuntimeError as e:
        log.error("worker group: %s", e)
        code = 1
    finally:
        _stop_all(engines, fronts)
        for address in addresses:
            with contextlib.suppress(OSError):
                os.unlink(address)
        with contextlib.suppress(OSError):
            sock_dir.rmdir()
    return code


def _stop_all(engines: list[subprocess.Popen], fronts: list[subprocess.Popen], timeout: float = 20.0) -> None:
    """Celery processes first (a warm shutdown lets running tasks finish), the engines last."""
    for group in (fronts, engines):
        for p in group:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in group:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout)
            if p.poll() is None:
                p.kill()
                p.wait(5)
