"""`arrcoc worker --processes N [--devices all]`: engine processes and Celery processes on a host.

This supervisor never touches a device. Per device (one, or each of `--devices`) it starts
ARRCOC_ENGINE__PROCESSES engine processes, a GPU's pinned to it with CUDA_VISIBLE_DEVICES, and N
Celery processes. The first engine process starts alone and fills the compile cache; the others
start together and warm from it. Once every engine listens, the Celery processes start; each may
send work to every engine of the host, each call to the one with the least work in flight from it
(`EngineClient`), so one batch job's chunks run on every device at once.

An engine process that exits is started again alone, and the Celery processes send its work to the
others meanwhile (an engine that keeps exiting, ARRCOC_ENGINE__RESTARTS times in ten minutes, stops
the group). A Celery process that exits stops the whole group: the supervisor exits non-zero
(compose or systemd restarts it; unacknowledged tasks are redelivered). Members get SIGKILL from
the kernel if the supervisor itself is killed, so a killed worker leaves no orphans behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
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

from arrcoc.service.host.wiring import Wiring
from arrcoc.settings import Settings
from arrcoc.tuning import ENGINE_RESTART_WINDOW_S

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


@dataclasses.dataclass
class EngineSpec:
    """One engine process of the group: its device, its socket, its environment."""

    device: str
    address: str
    env: dict[str, str]


def count_gpus(base: Mapping[str, str]) -> int:
    """The GPUs this host shows (under CUDA_VISIBLE_DEVICES), counted in a child process so that
    the supervisor itself never initialises CUDA."""
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        env=dict(base),
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        return int(probe.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RuntimeError(f"could not count the GPUs: {probe.stderr.strip()[-300:]}") from None


def resolve_devices(settings: Settings, base: Mapping[str, str]) -> list[str]:
    """The group's devices: `settings.engine.devices` ("all": cuda:0 ... cuda:n-1), else its one device."""
    if settings.engine.devices == ("all",):
        n = count_gpus(base)
        if n == 0:
            raise RuntimeError("--devices all: this host shows no GPU (is CUDA_VISIBLE_DEVICES empty?)")
        return [f"cuda:{i}" for i in range(n)]
    return list(settings.engine.devices) or [settings.engine.device]


def _pinned(device: str, base: Mapping[str, str]) -> dict[str, str]:
    """The environment that gives an engine process `device` alone, as its cuda:0."""
    if not device.startswith("cuda:"):
        return {"ARRCOC_ENGINE__DEVICE": device}
    index = int(device.split(":")[1])
    visible = [v.strip() for v in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and index >= len(visible):
        raise RuntimeError(f"{device}: CUDA_VISIBLE_DEVICES shows only {len(visible)} GPU(s)")
    return {
        "CUDA_VISIBLE_DEVICES": visible[index] if visible else str(index),
        "ARRCOC_ENGINE__DEVICE": "cuda:0",
    }


def plan_engines(
    settings: Settings,
    devices: Sequence[str],
    per_device: int,
    sock_dir: Path,
    authkey: bytes,
    base: Mapping[str, str],
) -> list[EngineSpec]:
    """The group's engine processes, interleaved by device (device 0's first, device 1's first,
    ..., device 0's second, ...) so that the i-th Celery process prefers engine i mod E and
    consecutive Celery processes prefer different devices."""
    pinned = len(devices) > 1 or bool(settings.engine.devices)
    addresses = [
        [str(sock_dir / f"engine-{di}-{e}.sock") for e in range(per_device)] for di in range(len(devices))
    ]
    specs = []
    for e in range(per_device):
        for di, device in enumerate(devices):
            env = dict(
                base,
                **Wiring(addresses[di][e], authkey, tuple(addresses[di])).to_env(),
                ARRCOC_ENGINE__DEVICES="",
                ARRCOC_ENGINE__WORKER_PROCESSES="1",
                ARRCOC_ENGINE__DEVICE=settings.engine.device,
                ARRCOC_ENGINE__BACKEND=settings.engine.backend,
                ARRCOC_ENGINE__DTYPE=settings.engine.dtype,
                ARRCOC_SERVICE__BROKER_URL=settings.service.queue_url,
            )
            if pinned:
                env.update(_pinned(device, base))
            # OpenMP (torch's CPU threads) reads this at start-up: idle OpenMP threads spin by
            # default, burning cores the other processes need
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            specs.append(EngineSpec(device, addresses[di][e], env))
    return specs


def front_env(
    spec: EngineSpec,
    pool: Sequence[str],
    base: Mapping[str, str],
    settings: Settings,
    devices: Sequence[str] = (),
) -> dict[str, str]:
    """A Celery process's environment: the group's settings and devices (it runs a batch chunk per
    device at a time), and the pool of engines it sends work to, its preferred one first. These
    processes run no model, only small copies: one OpenMP thread each (torch.set_num_threads would
    apply to the calling thread only)."""
    env = dict(
        spec.env,
        **Wiring(pool[0], Wiring.from_env(spec.env).authkey, (), tuple(pool)).to_env(),
        ARRCOC_ENGINE__DEVICE=settings.engine.device,
        ARRCOC_ENGINE__DEVICES=",".join(devices),
    )
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if "CUDA_VISIBLE_DEVICES" in base:
        env["CUDA_VISIBLE_DEVICES"] = base["CUDA_VISIBLE_DEVICES"]
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class _Engines:
    """The group's engine processes: started, watched, started again when one exits."""

    def __init__(self, specs: list[EngineSpec], authkey: bytes, restarts: int):
        self.specs = specs
        self.authkey = authkey
        self.restarts = restarts
        self.procs: list[subprocess.Popen | None] = [None] * len(specs)
        self.exits: list[list[float]] = [[] for _ in specs]

    def start(self, i: int) -> subprocess.Popen:
        with contextlib.suppress(OSError):
            os.unlink(self.specs[i].address)  # a dead engine's socket: bind() would refuse the path
        self.procs[i] = subprocess.Popen(
            [sys.executable, "-m", "arrcoc.service.host.engine_process"],
            env=self.specs[i].env,
            preexec_fn=_die_with_parent,
        )
        return self.procs[i]

    def start_all(self, timeout: float) -> None:
        """The first alone (it fills the compile cache), then the rest together."""
        if not self.specs:
            return
        _wait_listening(self.start(0), self.specs[0].address, self.authkey, timeout)
        rest = [(self.start(i), self.specs[i].address) for i in range(1, len(self.specs))]
        for proc, address in rest:
            _wait_listening(proc, address, self.authkey, timeout)

    def watch(self) -> None:
        """Start again each engine that has exited; RuntimeError when one exits too often."""
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if proc is None or proc.poll() is None:
                continue
            recent = [t for t in self.exits[i] if now - t < ENGINE_RESTART_WINDOW_S] + [now]
            self.exits[i] = recent
            spec = self.specs[i]
            if len(recent) > self.restarts:
                raise RuntimeError(
                    f"the engine process on {spec.device} exited {len(recent)} times within"
                    f" {ENGINE_RESTART_WINDOW_S:.0f} s (last code {proc.returncode})"
                )
            log.error(
                "worker group: the engine process %d on %s exited with code %s; starting it again"
                " (the other engines take its work meanwhile)",
                proc.pid,
                spec.device,
                proc.returncode,
            )
            self.start(i)

    @property
    def running(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p is not None]


def run_group(
    processes: int, front_args: list[str], hostname: str, settings: Settings, ready_timeout: float = 1800.0
) -> int:
    """Run the group until a signal or a Celery process's exit; returns the exit code. The members
    are new processes: they read `settings` from the environment they are started with.
    `processes`: Celery processes per device."""
    sock_dir = Path(tempfile.mkdtemp(prefix="arrcoc-engine-"))
    authkey = secrets.token_bytes(16)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    engines = _Engines([], authkey, settings.engine.restarts)
    fronts: list[subprocess.Popen] = []  # the Celery processes
    code = 0
    try:
        devices = resolve_devices(settings, os.environ)
        specs = plan_engines(
            settings, devices, min(settings.engine.processes, processes), sock_dir, authkey, os.environ
        )
        engines.specs, engines.procs, engines.exits = specs, [None] * len(specs), [[] for _ in specs]
        engines.start_all(ready_timeout)
        pool = [s.address for s in specs]
        for i in range(processes * len(devices)):
            argv = [sys.executable, "-m", "arrcoc", "worker", *front_args, "-n", node_name(hostname, i + 1)]
            k = i % len(specs)
            env = front_env(
                specs[k],
                pool[k:] + pool[:k],
                os.environ,
                settings,
                devices if settings.engine.devices else (),
            )
            fronts.append(subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent))
        log.info(
            "worker group on %s: engine processes %s, Celery processes %s",
            ", ".join(devices),
            [p.pid for p in engines.running],
            [p.pid for p in fronts],
        )
        while not stop.wait(0.5):
            engines.watch()
            ended = next((p for p in fronts if p.poll() is not None), None)
            if ended is not None:
                log.error(
                    "worker group: Celery process %d exited with code %s; stopping the group",
                    ended.pid,
                    ended.returncode,
                )
                code = ended.returncode or 1
                break
    except RuntimeError as e:
        log.error("worker group: %s", e)
        code = 1
    finally:
        _stop_all(engines.running, fronts)
        for spec in engines.specs:
            with contextlib.suppress(OSError):
                os.unlink(spec.address)
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
