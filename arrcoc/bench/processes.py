"""Processes for benchmarks (and the tests) that run the real thing: a redis-server and worker processes.

Everything started here is a subprocess in its own process group, stopped (and killed if need be)
by `stop()` / the context managers, so a failing test leaves nothing running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from ..settings import env_name, settings_env

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A subprocess in its own session, output to a log file."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path, cwd: Path = REPO):
        self.log = log
        self._fh = open(log, "ab")
        self.p = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 10.0) -> None:
        self.kill(signal.SIGTERM)
        try:
            self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.p.wait(5)
        self._fh.close()


class RedisServer(Proc):
    """redis-server on a free port with the persistence settings compose uses (AOF, noeviction)."""

    def __init__(self, workdir: Path, port: int | None = None, io_threads: int = 1):
        self.port = port or free_port()
        self.dir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(workdir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--maxmemory-policy",
            "noeviction",
            "--save",
            "",
            "--protected-mode",
            "no",
        ]
        if io_threads > 1:  # sockets read and written by helper threads: large values off the main thread
            argv += ["--io-threads", str(io_threads), "--io-threads-do-reads", "yes"]
        super().__init__(argv, dict(os.environ), workdir / "redis.log")
        self.wait_ready()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def wait_ready(self, timeout: float = 10.0) -> None:
        import redis

        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server on {self.port} did not start: {self.text()[-500:]}")


def worker_env(broker: str, data_dir: Path, **groups: Mapping[str, object]) -> dict[str, str]:
    """This environment for a worker on this Redis and data folder, with these settings on top
    (by group, as Settings.replace takes them: engine={"device": "cpu"})."""
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
        }
    )
    env.update(settings_env(service={"broker_url": broker, "data_dir": data_dir}))
    env.update(settings_env(**groups))
    return env


class Worker(Proc):
    """`arrcoc worker` as a subprocess; `ready()` waits until its engine is warm."""

    def __init__(
        self,
        env: dict[str, str],
        log: Path,
        concurrency: int | None = None,
        pool: str = "threads",
        name: str | None = None,
    ):
        self.name = name or f"t{uuid.uuid4().hex[:8]}@%h"
        argv = [sys.executable, "-m", "arrcoc", "worker", "-l", "info", "-n", self.name, "-P", pool]
        if concurrency:
            argv += ["-c", str(concurrency)]
        self.env = env
        super().__init__(argv, env, log)

    def ready(self, timeout: float = 120.0) -> Worker:
        """Until the engine is warm and, in a group (ARRCOC_ENGINE__WORKER_PROCESSES), every Celery process
        has reached it."""
        devices = [d for d in self.env.get(env_name("engine.devices"), "").split(",") if d.strip()]
        processes = int(self.env.get(env_name("engine.worker_processes"), "1")) * max(1, len(devices))
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            text = self.text()
            if (
                "engine " in text
                and " ready in " in text
                and (processes == 1 or text.count("serves this worker") >= processes)
            ):
                return self
            if not self.alive():
                raise RuntimeError(f"the worker exited: {text[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"the worker was not ready in {timeout} s: {self.text()[-2000:]}")


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command name: [state, ppid, ..., utime (11), stime (12), ...]."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def child_pids(pid: int) -> list[int]:
    """A process's children, oldest first (a worker group: the engine process, then Celery's)."""
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
