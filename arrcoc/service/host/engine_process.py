"""The engine in a process of its own, fed by several Celery worker processes on the same device.

Why: one Celery process takes its messages through one consumer thread under one GIL (receive,
acks_late bookkeeping, task events, results), ~135 requests/s on the H100 host, so batching in
that process cannot go faster than that (docs/service.md). `arrcoc worker --processes N` runs N
Celery processes that check, decode and resize requests in parallel and send them here, where one
Runtime (engine + dynamic batcher) serves them all: vLLM splits its API server from its engine
core for the same reason.

Wire: pickled tuples over a local socket (`multiprocessing.connection`, AF_UNIX, an auth key the
supervisor makes per group). One connection per client thread; a request is `(op, *args)`, the
reply `("ok", value)` or `("err", error)` (the wire form of arrcoc.service.codec), with `("progress", fraction, message)` before a
benchmark's reply. An interactive request's pixels do not go through the socket: each connection
has a pixel buffer in shared memory (a memfd the client hands over once, SCM_RIGHTS), the client
writes its request's pixels there and the engine copies them to the device before it queues the
request: receiving, unpickling and pinning 0.8 MB per request had been the engine process's
largest cost besides the model (its CPU per request fell 4.7 -> 4.0 ms, scripts/batching_bench.py
on the H100). Batch chunks still pickle their pixels as numpy arrays (torch's own pickling for
multiprocessing expects shared-memory handles).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import mmap
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Sequence
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any

import numpy as np
import torch

from ...errors import ArrcocError, DeadlineExceeded, EngineError, JobCancelled, ServiceUnavailableError
from ...pipeline import PreparedRequest, prepare_request
from ...registry import get_variant
from ...request import Controls, image_limits
from ...result import RelevanceResult
from ...settings import Settings, get_settings
from ..codec import error_from_wire, error_to_wire
from ..jobs.types import BenchRequest
from .interface import EngineHost, Progress
from .runtime import Runtime

log = logging.getLogger(__name__)


class EngineUnavailableError(ServiceUnavailableError):
    """The engine process did not answer (it stopped, or is restarting with its worker group)."""


def _send(conn: Connection, msg: Any) -> None:
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _to_wire(r: PreparedRequest) -> PreparedRequest:
    return dataclasses.replace(r, pixels=r.pixels.numpy())


def _from_wire(r: PreparedRequest) -> PreparedRequest:
    return dataclasses.replace(r, pixels=torch.from_numpy(r.pixels))


class PixelBuffer:
    """Memory shared by one client thread and its connection's server thread: a memfd, mapped by
    both, seen as a uint8 array of one request's pixels (3, S, S). The client creates it and hands
    the descriptor over once (`send`); the engine maps what it receives. Neither keeps the
    descriptor: the maps keep the memory, freed when both are gone. Used by one request at a time:
    the client writes the next only after the reply to the last, and the engine copies out before
    it queues a request."""

    MAX_BYTES = 3 * 4096 * 4096

    def __init__(self, shape: tuple[int, ...], fd: int | None = None):
        self.shape = tuple(int(n) for n in shape)
        size = math.prod(self.shape)
        received = fd is not None
        if fd is None:
            fd = os.memfd_create("arrcoc-pixels", os.MFD_CLOEXEC)
        try:
            if not 0 < size <= self.MAX_BYTES:
                raise EngineError(f"A pixel buffer of shape {self.shape} is out of range.")
            if not received:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        if received:
            os.close(fd)
        self._fd = None if received else fd
        self.array: np.ndarray | None = np.frombuffer(self._map, dtype=np.uint8).reshape(self.shape)

    def send(self, conn: Connection) -> None:
        """Hand the memory to the other end of `conn` (SCM_RIGHTS), then drop our descriptor."""
        send_handle(conn, self._fd, 0)
        os.close(self._fd)
        self._fd = None

    def tensor(self) -> torch.Tensor:
        """The buffer as a CPU tensor (no copy: copy it before the client may write again)."""
        return torch.from_numpy(self.array)

    def close(self) -> None:
        self.array = None  # the map cannot close while an array still exports it
        with contextlib.suppress(BufferError, OSError, ValueError):
            self._map.close()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclasses.dataclass
class _Peer:
    """One client connection as the server sees it."""

    conn: Connection
    pixels: PixelBuffer | None = None

    def close(self) -> None:
        if self.pixels is not None:
            self.pixels.close()


# -- the server: in the engine process ------------------------------------------------------------
class EngineServer:
    """Serves one Runtime to local clients: a thread per connection, all sharing its batcher."""

    def __init__(self, runtime: Runtime, address: str, authkey: bytes):
        self.runtime = runtime
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
            try:
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
                    try:
                        _send(conn, reply)
                    except (OSError, ValueError):
                        return
            finally:  # nothing queued refers to the buffer: requests copy out of it first
                peer.close()

    def _op_attach(self, peer: _Peer, shape: tuple[int, ...]) -> None:
        fd = recv_handle(peer.conn)  # sent right after this message
        peer.close()
        peer.pixels = PixelBuffer(shape, fd)

    def _op_info(self, peer: _Peer) -> dict[str, Any]:
        return {
            "max_batch": self.runtime.max_batch,
            "pid": os.getpid(),
            "device": str(self.runtime.pipeline.device),
        }

    def _op_infer(
        self, peer: _Peer, request: PreparedRequest, timeout: float, backend: str | None
    ) -> RelevanceResult:
        if peer.pixels is None:  # the pixels wait in this connection's shared buffer
            raise EngineError("No pixel buffer is attached to this connection.")
        pixels = self.runtime.copy_to_device(peer.pixels.tensor(), backend)
        return self.runtime.infer_prepared(dataclasses.replace(request, pixels=pixels), timeout, backend)

    def _op_run(self, peer: _Peer, items: list[PreparedRequest], backend: str | None) -> list[Any]:
        out = self.runtime.run_batch([_from_wire(r) for r in items], backend)
        return [error_to_wire(r) if isinstance(r, BaseException) else r for r in out]

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

        return self.runtime.benchmark(request, progress)


BENCH_PROGRESS_EVERY_S = 0.25  # a benchmark's progress (and with it a cancel) crosses the socket this often


# -- the client: in each Celery worker process ------------------------------------------------------
class EngineClient(EngineHost):
    """The engine host as a Celery worker process of a group sees it: the engine process.

    Requests are checked, decoded and resized here (in the task's thread), so only the engine's
    work is serialised in the engine process.
    """

    def __init__(self, settings: Settings, address: str, authkey: bytes):
        self.settings = settings
        self._address = address
        self._authkey = authkey
        self._variant = get_variant(settings.variant)
        self._limits = image_limits(settings)
        self._local = threading.local()  # one connection per thread: replies never interleave
        self._info: dict[str, Any] | None = None

    def _conn(self) -> tuple[Connection, PixelBuffer]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = Client(self._address, family="AF_UNIX", authkey=self._authkey)
            size = self._variant.image_size
            pixels = self._local.pixels = PixelBuffer((3, size, size))
            _send(conn, ("attach", pixels.shape))
            pixels.send(conn)
            kind, *payload = _recv(conn)
            if kind == "err":
                raise error_from_wire(payload[0])
        return conn, self._local.pixels

    def _drop(self) -> None:
        """Forget this thread's connection and its pixel buffer (a reply may still be on its way)."""
        conn = getattr(self._local, "conn", None)
        pixels = getattr(self._local, "pixels", None)
        self._local.conn = self._local.pixels = None
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()
        if pixels is not None:
            pixels.close()

    def _call(self, msg: tuple, timeout: float | None = None,
              on_progress: Progress | None = None,
              pixels: torch.Tensor | None = None) -> Any:  # fmt: skip
        try:
            conn, buffer = self._conn()
            if pixels is not None:  # into the shared buffer: the message carries none
                np.copyto(buffer.array, pixels.numpy())
            _send(conn, msg)
            while True:
                if not conn.poll(timeout):
                    raise DeadlineExceeded(f"No result within {timeout:.0f} s; the engine is busy. Try again.")
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
            self._drop()
            if isinstance(e, ArrcocError):  # DeadlineExceeded is a TimeoutError, hence an OSError
                raise
            raise EngineUnavailableError(f"The engine process is not answering ({type(e).__name__}); the worker"
                                         " group restarts when it stops. Try again.") from None  # fmt: skip
        except BaseException:  # a reply may still come: this connection is out of step now
            self._drop()
            raise
        if kind == "err":
            raise error_from_wire(payload[0])
        return payload[0]

    @property
    def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = self._call(("info",), timeout=self.settings.redis_timeout_s * 6)
        return self._info

    def warm(self) -> None:
        log.info("engine process %s on %s serves this worker (max batch %d)", self.info["pid"], self.info["device"],
                 self.max_batch)  # fmt: skip

    @property
    def max_batch(self) -> int:
        return int(self.info["max_batch"])

    def prepare(self, image: Any, query: str, controls: Controls) -> PreparedRequest:
        return prepare_request(image, query, controls, self._variant.config, self._variant.image_size,
                               self.settings.max_query_chars, self._limits)  # fmt: skip

    def infer(
        self, image: Any, query: str, controls: Controls, timeout: float, backend: str | None = None
    ) -> RelevanceResult:
        self.settings.served_backend(backend)  # an unserved backend is a clear error, before any work
        request = self.prepare(image, query, controls)
        t0 = time.perf_counter()
        # the engine keeps the deadline; the extra second is for the reply to arrive
        result = self._call(("infer", dataclasses.replace(request, pixels=None), timeout, backend),
                            timeout=timeout + 1.0, pixels=request.pixels)  # fmt: skip
        # the round trip: batching delay + engine + the socket both ways (model_ms is the engine's part)
        return dataclasses.replace(result, timings_ms=result.timings_ms | {"engine_wall_ms": (time.perf_counter() - t0) * 1e3})

    def run_batch(
        self, items: Sequence[PreparedRequest], backend: str | None = None
    ) -> list[RelevanceResult | Exception]:
        out = self._call(("run", [_to_wire(r) for r in items], backend))
        return [error_from_wire(r) if isinstance(r, dict) else r for r in out]

    def benchmark(self, request: BenchRequest, progress: Progress | None = None
                  ) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
        return self._call(("bench", request), on_progress=progress)

    def close(self) -> None:
        self._drop()


# -- the engine process's entry point ------------------------------------------------------------------
def main() -> int:
    """`python -m arrcoc.service.host.engine_process`: started by `arrcoc worker --processes N`."""
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s/engine] %(message)s")
    settings = get_settings()
    if not settings.engine_socket or not settings.engine_authkey:
        print("ARRCOC_ENGINE_SOCKET and ARRCOC_ENGINE_AUTHKEY must be set (arrcoc worker --processes N sets them)",
              file=sys.stderr)  # fmt: skip
        return 2
    # the batch thread launches the model's kernels holding the GIL between them; a connection
    # thread that takes the GIL meanwhile may keep it for the switch interval (5 ms by default, as
    # long as an eager batch's whole launch). Cheap; its effect on the H100 was within the noise.
    sys.setswitchinterval(0.0005)
    runtime = Runtime(settings)
    runtime.warm()
    # listening only once warm: a client that connects is served at once
    server = EngineServer(runtime, settings.engine_socket, bytes.fromhex(settings.engine_authkey))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # out of accept(), through the finally below
    log.info("engine process %d listening on %s", os.getpid(), settings.engine_socket)
    try:
        server.serve_forever()
    finally:
        server.close()
        runtime.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
