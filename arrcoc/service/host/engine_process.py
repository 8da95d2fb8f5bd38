"""The engine in a process of its own, fed by several Celery worker processes on the same device.

Why: one Celery process takes its messages through one consumer thread under one GIL (receive,
acks_late bookkeeping, task events, results), so batching in
that process cannot go faster than that (docs/service.md). `arrcoc worker --processes N` runs N
Celery processes that take messages and fetch image bytes in parallel and send them here, where
one Runtime (engine + dynamic batcher) decodes them on the engine's own path (nvJPEG on a GPU, so a
result is the same whichever way it came) and serves them all: vLLM splits its API server from its
engine core for the same reason.

A group runs one or several engine processes per device (ARRCOC_ENGINE__PROCESSES, `--devices`),
as Triton runs several instances of a model on one GPU: under load one engine process is bound by
its own Python (decode and engine stages, a connection thread per request, one GIL) while the GPU
idles (docs/service.md). Each builds the same engine from the same compile cache and decodes on the
same path, so results do not depend on which one served. Every Celery process may reach every
engine process of its group and sends each call to the least loaded (`EngineClient`). A benchmark in
one holds its device in all of that device's engine processes (the `hold` operation).

Wire: pickled tuples over a local socket (`multiprocessing.connection`, AF_UNIX, an auth key the
supervisor makes per group). One connection per client thread; a request is `(op, *args)`, the
reply `("ok", value)` or `("err", error)` (the wire form of arrcoc.service.codec), with
`("progress", fraction, message)` before a benchmark's reply. Images cross as their encoded bytes
(a JPEG is ~20x smaller than its decoded pixels), a batch step's outputs and encoded overlays come
back: the Celery processes read a chunk's files and write its results (the batch pipeline of
arrcoc.service.jobs.batch, run there over an EngineClient), so that writing spreads over their
interpreters while the engine process decodes and runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pickle
import signal
import struct
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy as np

from ...errors import ArrcocError, DeadlineExceeded, EngineError, JobCancelled, ServiceUnavailableError
from ...request import Controls
from ...result import RelevanceResult
from ...settings import DEFAULT_OVERLAY_KIND, Settings, get_settings
from ...tuning import BENCH_PROGRESS_EVERY_S, ENGINE_DOWN_S
from ..codec import error_from_wire, error_to_wire
from ..jobs.types import BenchRequest
from .interface import EngineHost, ProcessedBatch, Progress, step_threads
from .runtime import Runtime
from .wiring import Wiring

log = logging.getLogger(__name__)


class EngineUnavailableError(ServiceUnavailableError):
    """The engine process did not answer (it stopped, or is restarting with its worker group)."""


def _send(conn: Connection, msg: Any) -> None:
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    """The next message, read as `Connection.recv_bytes` frames it (a 4-byte length, or -1 and an
    8-byte one) into one buffer by `os.readv`, which lets go of the GIL while the kernel copies.
    recv_bytes reads a large message piece by piece, allocating and copying each under the GIL: a
    step's photos, megabytes, cost the engine process's other threads their turn meanwhile."""
    fd = conn.fileno()
    (size,) = struct.unpack("!i", _read_exact(fd, 4, first=True))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exact(fd, 8))
    return pickle.loads(_read_exact(fd, size))


def _read_exact(fd: int, size: int, first: bool = False) -> memoryview:
    """`size` bytes from `fd`; EOFError when it ends before the `first` bytes of a message,
    OSError when it ends within one."""
    buf = memoryview(np.empty(size, np.uint8))  # not zeroed: every byte is read into
    got = 0
    while got < size:
        n = os.readv(fd, [buf[got:]])
        if n == 0:
            if first and got == 0:
                raise EOFError
            raise OSError("got end of file during message")
        got += n
    return buf


@dataclasses.dataclass
class _Peer:
    """One client connection as the server sees it."""

    conn: Connection


# the engine process's exit status once its GPU's context is unusable (its group starts it again)
EXIT_DEVICE_LOST = 75


def _failed(reply: tuple[str, Any]) -> bool:
    """Whether a reply carries an error: the call's, or an item's of a step."""
    kind, payload = reply
    return kind == "err" or (
        isinstance(payload, ProcessedBatch) and any(e is not None for e in payload.errors)
    )


# -- the server: in the engine process ------------------------------------------------------------
class EngineServer:
    """Serves one Runtime to local clients: a thread per connection, all sharing its batcher."""

    def __init__(self, runtime: Runtime, address: str, authkey: bytes, group: Sequence[str] = ()):
        self.runtime = runtime
        self.address = address
        self._authkey = authkey
        self.group = tuple(group) or (address,)  # every engine process on this device, in order
        self._served_lock = threading.Lock()
        self.served = {
            "requests": 0,
            "items": 0,
        }  # what this process has answered (the health check shows it)
        self.listener = Listener(address, family="AF_UNIX", authkey=authkey)

    def serve_forever(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except OSError:  # the listener closed: shutting down
                return
            except Exception as e:  # noqa: BLE001 -- a client with the wrong key: refuse it, keep serving
                log.warning("refused a connection: %s", e)
                continue
            threading.Thread(target=self._serve, args=(conn,), name="arrcoc-engine-conn", daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _serve(self, conn: Connection) -> None:
        peer = _Peer(conn)
        with conn:
            while True:
                try:
                    op, *args = _recv(conn)
                except (EOFError, OSError):
                    return  # the client thread or its process went away
                try:
                    handler = getattr(self, f"_op_{op}", None)
                    if handler is None:
                        raise EngineError(f"Unknown engine operation {op!r}.")
                    reply = ("ok", handler(peer, *args))
                except Exception as e:  # noqa: BLE001 -- every error goes back to the caller
                    reply = ("err", error_to_wire(e))
                lost = self.runtime.device_lost() if _failed(reply) else None
                try:
                    _send(conn, reply)
                except (OSError, ValueError):
                    return
                finally:
                    if lost:
                        self._exit_lost(lost)

    def _exit_lost(self, why: str) -> None:
        """The GPU's context is unusable: every later call would fail the same way. This process
        exits, its worker group starts it again, and the work in flight on it goes back to its
        callers (EngineUnavailableError: their tasks are tried again, an item that was running
        counts an attempt)."""
        log.critical(
            "the device can run nothing more (%s); this engine process exits to be started again", why
        )
        os._exit(EXIT_DEVICE_LOST)

    def _count(self, items: int) -> None:
        with self._served_lock:
            self.served["requests"] += 1
            self.served["items"] += items

    def _op_info(self, peer: _Peer) -> dict[str, Any]:
        return {
            "max_batch": self.runtime.max_batch,
            "pid": os.getpid(),
            "device": str(self.runtime.pipeline.device),
            # the GPU this process is pinned to (its cuda:0), as the host numbers it
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "served": dict(self.served),
        }

    def _op_infer(
        self, peer: _Peer, image: Any, query: str, controls: Controls, timeout: float, backend: str | None
    ) -> RelevanceResult:
        result = self.runtime.infer(image, query, controls, timeout, backend)
        self._count(1)
        return result

    def _op_process(
        self,
        peer: _Peer,
        images: list[bytes],
        queries: list[str],
        controls: Controls,
        overlay: str,
        backend: str | None,
        kind: str = DEFAULT_OVERLAY_KIND,
    ) -> ProcessedBatch:
        processed = self.runtime.process(images, queries, controls, overlay, backend, kind)
        self._count(len(images))
        return processed

    def _op_bench(self, peer: _Peer, request: BenchRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        last = [0.0]

        def progress(fraction: float, message: str) -> None:
            """Progress to the client, which answers go or stop (its job was cancelled): a stop
            raises JobCancelled here, so the benchmark ends and the device is free at once."""
            if time.monotonic() - last[0] < BENCH_PROGRESS_EVERY_S and fraction < 1:
                return
            last[0] = time.monotonic()
            _send(peer.conn, ("progress", fraction, message))
            answer, *why = _recv(peer.conn)
            if answer == "stop":
                raise JobCancelled(why[0] if why else "The benchmark was cancelled.")

        peers: list[dict[str, Any]] = []
        with self._group_held(peers):
            report, note = self.runtime.benchmark(request, progress)
        return report, note | ({"engine_processes_held": peers} if peers else {})

    def _op_hold(self, peer: _Peer) -> dict[str, Any]:
        """Hold this process's device for a benchmark in another engine process of the group:
        until it says release, or its connection closes."""
        with self.runtime.exclusive() as note:
            _send(peer.conn, ("ok", "held"))
            with contextlib.suppress(EOFError, OSError):
                _recv(peer.conn)
        return note

    @contextlib.contextmanager
    def _group_held(self, notes: list[dict[str, Any]]) -> Iterator[None]:
        """The device held in every engine process of the group (this one's lock included), taken
        in the group's order: two benchmarks in two of them never wait on each other crosswise.
        Each other process's note of its hold (as Runtime.exclusive's) lands in `notes` on release."""
        with contextlib.ExitStack() as held:
            for address in self.group:
                held.enter_context(
                    self.runtime.device_lock if address == self.address else self._peer_held(address, notes)
                )
            yield

    @contextlib.contextmanager
    def _peer_held(self, address: str, notes: list[dict[str, Any]]) -> Iterator[None]:
        with Client(address, family="AF_UNIX", authkey=self._authkey) as conn:
            _send(conn, ("hold",))
            kind, *payload = _recv(conn)
            if kind != "ok":
                raise error_from_wire(payload[0])
            try:
                yield
            finally:
                with contextlib.suppress(EOFError, OSError):
                    _send(conn, ("release",))
                    kind, *payload = _recv(conn)  # the peer has let go
                    notes.append(payload[0] if kind == "ok" else {"error": payload[0]})


# -- the client: in each Celery worker process ------------------------------------------------------
class _Route:
    """One engine process of the pool as this client sees it."""

    def __init__(self, address: str):
        self.address = address
        self.local = threading.local()  # one connection per thread: replies never interleave
        self.in_flight = 0  # items sent from this process and not answered yet
        self.down_until = 0.0  # after a failed call: skipped until then while another engine is up


class EngineClient(EngineHost):
    """The engine host as a Celery worker process of a group sees it: the group's engine processes
    (every device's), which decode, batch and run what this process sends (see the module
    docstring). Each call goes to the engine with the fewest items in flight from this process,
    the first of the pool when they are even: the least-outstanding-requests choice of load
    balancers, which needs no shared state between Celery processes. A call whose engine stops
    answering is sent once more to another engine; the one that failed is skipped for a while
    (its supervisor starts it again)."""

    def __init__(self, settings: Settings, addresses: str | Sequence[str], authkey: bytes):
        self.settings = settings
        self._routes = [_Route(a) for a in ([addresses] if isinstance(addresses, str) else addresses)]
        if not self._routes:
            raise ValueError("an engine client needs at least one engine address")
        self._authkey = authkey
        self._lock = threading.Lock()
        self._info: dict[str, Any] | None = None
        self.step_pool = step_threads(settings)

    def _conn(self, route: _Route) -> Connection:
        conn = getattr(route.local, "conn", None)
        if conn is None:
            conn = route.local.conn = Client(route.address, family="AF_UNIX", authkey=self._authkey)
        return conn

    def _drop(self, route: _Route) -> None:
        """Forget this thread's connection (a reply may still be on its way)."""
        conn = getattr(route.local, "conn", None)
        route.local.conn = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

    def _pick(self, items: int, avoid: _Route | None = None) -> _Route | None:
        """The engine with the least work in flight among those up (any when none is), reserved for
        `items`; None when `avoid` is the only one."""
        now = time.monotonic()
        with self._lock:
            routes = [r for r in self._routes if r is not avoid]
            if not routes:
                return None
            up = [r for r in routes if r.down_until <= now] or routes
            route = min(up, key=lambda r: r.in_flight)  # min keeps the first of equals: the preferred
            route.in_flight += items
            return route

    def _release(self, route: _Route, items: int) -> None:
        with self._lock:
            route.in_flight -= items

    def _routed(self, msg: tuple, items: int, timeout: float | None = None) -> Any:
        """`msg` to the least-loaded engine; once more to another if that one stops answering."""
        route = self._pick(items)
        try:
            return self._call(route, msg, timeout)
        except EngineUnavailableError:
            route.down_until = time.monotonic() + ENGINE_DOWN_S
            other = self._pick(items, avoid=route)
            if other is None:
                raise
            log.warning(
                "the engine process at %s is not answering; its call goes to %s", route.address, other.address
            )
            try:
                return self._call(other, msg, timeout)
            except EngineUnavailableError:
                other.down_until = time.monotonic() + ENGINE_DOWN_S
                raise
            finally:
                self._release(other, items)
        finally:
            self._release(route, items)

    def _call(
        self, route: _Route, msg: tuple, timeout: float | None = None, on_progress: Progress | None = None
    ) -> Any:
        try:
            conn = self._conn(route)
            _send(conn, msg)
            while True:
                if not conn.poll(timeout):
                    raise DeadlineExceeded(
                        f"No result within {timeout:.0f} s; the engine is busy. Try again."
                    )
                kind, *payload = _recv(conn)
                if kind != "progress":
                    break
                try:  # every progress message is answered: go on, or stop (the job was cancelled)
                    if on_progress:
                        on_progress(*payload)
                    _send(conn, ("go",))
                except JobCancelled as e:
                    on_progress = None
                    _send(conn, ("stop", str(e)))
        except (EOFError, OSError, AuthenticationError) as e:
            self._drop(route)
            if isinstance(e, ArrcocError):  # DeadlineExceeded is a TimeoutError, hence an OSError
                raise
            raise EngineUnavailableError(
                f"The engine process is not answering ({type(e).__name__}); it is being"
                " started again. Try again."
            ) from None
        except BaseException:  # a reply may still come: this connection is out of step now
            self._drop(route)
            raise
        if kind == "err":
            raise error_from_wire(payload[0])
        return payload[0]

    @property
    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self._routed(("info",), 0, timeout=self.settings.service.redis_timeout_s * 6)
        return self._info

    def engines(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Every engine of the pool, each asked for its info and what it has served, or `up: False`
        and why not (the worker group's health check)."""
        out = []
        for route in self._routes:
            try:
                out.append({"address": route.address, "up": True, **self._call(route, ("info",), timeout)})
            except (EngineUnavailableError, DeadlineExceeded) as e:
                out.append({"address": route.address, "up": False, "error": f"{type(e).__name__}: {e}"})
        return out

    def warm(self) -> None:
        log.info(
            "engine process %s on %s serves this worker (max batch %d; %d engine(s) in its pool)",
            self.info["pid"],
            self.info["device"],
            self.max_batch,
            len(self._routes),
        )

    @property
    def max_batch(self) -> int:
        return int(self.info["max_batch"])

    @property
    def on_cpu(self) -> bool:
        return str(self.info["device"]).startswith("cpu")

    def infer(
        self, image: Any, query: str, controls: Controls, timeout: float, backend: str | None = None
    ) -> RelevanceResult:
        self.settings.engine.served_backend(backend)  # an unserved backend is a clear error, before any work
        t0 = time.perf_counter()
        # the engine keeps the deadline; the extra second is for the reply to arrive
        result = self._routed(("infer", image, query, controls, timeout, backend), 1, timeout=timeout + 1.0)
        # the round trip: batching delay + engine + the socket both ways (model_ms is the engine's part)
        return dataclasses.replace(
            result, timings_ms=result.timings_ms | {"engine_wall_ms": (time.perf_counter() - t0) * 1e3}
        )

    def process(
        self,
        images: Sequence[bytes],
        queries: Sequence[str],
        controls: Controls,
        overlay: str,
        backend: str | None = None,
        kind: str = DEFAULT_OVERLAY_KIND,
    ) -> ProcessedBatch:
        """A batch step on the least-loaded engine process: its photos go as their encoded bytes,
        its outputs and encoded overlays come back (Runtime.process over there)."""
        return self._routed(
            ("process", list(images), list(queries), controls, overlay, backend, kind), len(images)
        )

    def benchmark(
        self, request: BenchRequest, progress: Progress | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """On the least-loaded engine, holding its device (not retried elsewhere: a benchmark job
        that loses its engine is redelivered as a whole)."""
        route = self._pick(0)
        try:
            return self._call(route, ("bench", request), on_progress=progress)
        finally:
            self._release(route, 0)

    def close(self) -> None:
        self.step_pool.shutdown(wait=False, cancel_futures=True)
        for route in self._routes:
            self._drop(route)


# -- the engine process's entry point ------------------------------------------------------------------
def main() -> int:
    """`python -m arrcoc.service.host.engine_process`: started by `arrcoc worker --processes N`."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s/engine] %(message)s")
    settings = get_settings()
    wiring = Wiring.from_env()
    if not wiring.in_group:
        print(
            "_ARRCOC_ENGINE_SOCKET and _ARRCOC_ENGINE_AUTHKEY must be set (arrcoc worker --processes N sets them)",
            file=sys.stderr,
        )
        return 2
    # the batch threads launch kernels and build results holding the GIL between waits; a
    # connection thread that takes the GIL meanwhile may keep it for the switch interval
    sys.setswitchinterval(settings.engine.switch_interval_ms / 1e3)
    runtime = Runtime(settings)
    runtime.warm()
    # listening only once warm: a client that connects is served at once
    server = EngineServer(runtime, wiring.socket, wiring.authkey, wiring.group)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # out of accept(), through the finally below
    log.info("engine process %d listening on %s", os.getpid(), wiring.socket)
    try:
        server.serve_forever()
    finally:
        server.close()
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
