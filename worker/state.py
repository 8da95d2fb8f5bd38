"""What a Celery worker process does for each task, so the tasks stay one line each.

`WorkerState` holds this process's engine host (the engine here, or the worker group's engine
process), Redis clients and job store; they are built lazily, after any fork. The functions return
JSON-safe documents: {"result": ...} or {"error": {"type", "message"}} for errors the user must
hear about.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from arrcoc.errors import ArrcocError, EngineError, ServiceUnavailableError
from arrcoc.request import Controls
from arrcoc.result import RelevanceResult
from arrcoc.service.client.queue import UNACKED_INDEX, problems_key
from arrcoc.service.codec import error_to_frame, error_to_wire, result_to_frame, result_to_wire
from arrcoc.service.host.interface import EngineHost
from arrcoc.service.host.wiring import Wiring
from arrcoc.service.jobs import batch, bench
from arrcoc.service.jobs.budget import release
from arrcoc.service.jobs.files import job_dir
from arrcoc.service.jobs.finishing import maybe_finalize
from arrcoc.service.jobs.guard import TRANSPORT_ERRORS, fail_unrecorded, reason_for
from arrcoc.service.jobs.store import RedisJobStore, redis_client
from arrcoc.service.jobs.types import JobState
from arrcoc.settings import Settings
from arrcoc.tuning import FOLLOWERS, GIVE_BACK_WAIT_S, LOAD_RETRY_S

log = logging.getLogger(__name__)


class DataUnreachable(ArrcocError):
    """This worker cannot see a job's data (another ARRCOC_SERVICE__DATA_DIR, shared storage not mounted):
    the chunk goes back to the queue for a worker that can, its items untouched."""


def _riding_out_redis(fn, waits: tuple[float, ...] = (0.5, 1, 2, 4, 8, 15)):
    """Run fn, retrying in place while Redis restarts: a Celery retry would need the broker itself."""
    for wait in (*waits, None):
        try:
            return fn()
        except ServiceUnavailableError:
            if wait is None:
                raise
            log.warning("Redis unavailable; retrying in %.1f s", wait)
            time.sleep(wait)


class FairGate:
    """One batch chunk (or benchmark) at a time in this process, owners in turn: when the turn
    frees, the waiting chunk whose owner was served longest ago goes next (arrival order among
    equals). Threads of a worker hold chunks it prefetched; a FIFO gate would run every chunk of a
    big job before the first chunk of a small job that came after it."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[int, str]] = []  # (arrival, owner)
        self._served: dict[str, float] = {}  # owner: when its last chunk started
        self._seq = 0

    @contextlib.contextmanager
    def turn(self, owner: str):
        """The turn, in `owner`'s order; yields `leave`, which frees it early."""
        with self._cv:
            self._seq += 1
            me = (self._seq, owner)
            self._waiting.append(me)
            while self._busy or min(self._waiting, key=lambda w: (self._served.get(w[1], 0.0), w[0])) != me:
                self._cv.wait()
            self._waiting.remove(me)
            self._busy = True
            self._served[owner] = time.monotonic()
            if len(self._served) > 10_000:  # bounded: the oldest owners are forgotten
                for old in sorted(self._served, key=self._served.get)[:5_000]:
                    del self._served[old]
        left = False

        def leave() -> None:
            """The turn freed before its block ends (once)."""
            nonlocal left
            if not left:
                left = True
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

        try:
            yield leave
        finally:
            leave()


class Heartbeat:
    """What this worker holds, kept alive while it holds it: every `every_s` (a quarter of the
    visibility timeout) the delivery times of the messages it received and has not acknowledged are
    renewed in the broker (a dead worker's stop being renewed, and come back within the timeout),
    and each chunk it runs is marked alive in the job store (a job whose chunk's marks stop says
    "a worker was lost, resuming" until another worker takes the chunk up)."""

    def __init__(self, state: WorkerState):
        self.state = state
        self._lock = threading.Lock()
        self._messages: dict[str, Any] = {}  # delivery tag: kombu message
        self._chunks: set[tuple[str, int, int]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def every_s(self) -> float:
        return max(1.0, self.state.settings.jobs.visibility_timeout_s / 4)

    @property
    def resume_s(self) -> float:
        """How long a lost chunk waits to be delivered again, at most (timeout, then a restore scan)."""
        vt = self.state.settings.jobs.visibility_timeout_s
        return vt + max(1, min(10, vt // 4))

    def hold(self, message: Any) -> None:
        tag = getattr(message, "delivery_tag", None)
        if tag is not None:
            with self._lock:
                self._messages[str(tag)] = message

    @contextlib.contextmanager
    def chunk(self, job_id: str, start: int, stop: int):
        with self._lock:
            self._chunks.add((job_id, start, stop))
        with contextlib.suppress(Exception):
            self.state.store().chunk_alive(job_id, start, stop, self.every_s, self.resume_s)
        try:
            yield
        finally:
            with self._lock:
                self._chunks.discard((job_id, start, stop))
            with contextlib.suppress(Exception):
                self.state.store().chunk_over(job_id, start, stop)

    def beat(self) -> None:
        with self._lock:
            for tag in [t for t, m in self._messages.items() if getattr(m, "acknowledged", False)]:
                del self._messages[tag]
            tags, chunks = list(self._messages), list(self._chunks)
        if tags:  # XX: only what is still unacknowledged there (a restored message is not re-added)
            self.state.raw.zadd(UNACKED_INDEX, dict.fromkeys(tags, time.time()), xx=True)
        for job_id, start, stop in chunks:
            self.state.store().chunk_alive(job_id, start, stop, self.every_s, self.resume_s)
        self.state.publish_problems()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="arrcoc-heartbeat", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.beat()
            except Exception as e:  # noqa: BLE001 -- Redis blinked: the next beat tries again
                log.warning("heartbeat failed: %s", e)

    def stop(self) -> None:
        self._stop.set()


class WorkerState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._load_lock = threading.Lock()
        self.settings: Settings | None = None
        self.node = f"arrcoc@{socket.gethostname()}"  # Celery's node name, once the worker starts
        self.heartbeat = Heartbeat(self)
        # what stops this worker serving, by kind ("model", "data"): its health check fails on them
        self._problems: dict[str, str] = {}
        self._load_failure: tuple[float, ArrcocError] | None = None  # (when, what a request hears)
        self.reset()

    def configure(self, settings: Settings) -> None:
        """The settings this process serves with (before the first task)."""
        self.settings = settings
        self.reset()

    def reset(self) -> None:
        self._host: EngineHost | None = None
        self._store: RedisJobStore | None = None
        self._raw = None
        # one batch chunk at a time, owners in turn; interactive work interleaves. Over several
        # devices too: a group has Celery processes per device, so one chunk each keeps every
        # engine as busy as on one device; more would crowd each engine's decoder and encoder
        self.chunk_gate = FairGate()
        self._followers = threading.BoundedSemaphore(FOLLOWERS)

    def host(self) -> EngineHost:
        """The engine in this process, or the group's engine process (`arrcoc worker --processes N`)."""
        with self._lock:
            if self._host is None:
                s = self.settings
                wiring = Wiring.from_env()
                if wiring.in_group:
                    from arrcoc.service.host.engine_process import EngineClient

                    self._host = EngineClient(s, wiring.pool or (wiring.socket,), wiring.authkey)
                else:
                    from arrcoc.service.host.runtime import Runtime

                    self._host = Runtime(s)
        return self._host

    # -- health: what stops this worker serving ---------------------------------------------------
    def warm(self) -> None:
        """Build and warm the engine before the first task. A model that cannot load is recorded,
        not raised: the worker stays up, answers every request with the reason at once and fails
        its health check (`arrcoc_health`) saying why."""
        with self._load_lock:
            self._load()

    def _load(self) -> None:
        try:
            self.host().warm()
        except Exception as e:  # noqa: BLE001 -- whatever stops the model loading is reported
            log.error("the model could not load: %s", e, exc_info=True)
            error = e if isinstance(e, ArrcocError) else EngineError(f"{type(e).__name__}: {e}")
            self._load_failure = (time.monotonic(), error)
            self._set_problem("model", f"its model ({self.settings.engine.variant}) could not load: {error}")
        else:
            self._load_failure = None
            self._set_problem("model", None)

    def loaded_host(self) -> EngineHost:
        """The engine host with its model loaded. A load that failed lately is answered again at
        once, with its reason; an older failure is tried again first (by one request)."""
        failure = self._load_failure
        if failure is not None and time.monotonic() - failure[0] >= LOAD_RETRY_S:
            with self._load_lock:
                if self._load_failure is failure:  # no other request has tried meanwhile
                    self._load()
            failure = self._load_failure
        if failure is not None:
            raise type(failure[1])(str(failure[1]))
        return self.host()

    def problems(self) -> list[str]:
        """What stops this worker serving, in words (empty: healthy)."""
        return list(self._problems.values())

    def _set_problem(self, kind: str, reason: str | None) -> None:
        if self._problems.get(kind) == reason:
            return
        if reason is None:
            self._problems.pop(kind, None)
        else:
            self._problems[kind] = reason
        self.publish_problems()

    def publish_problems(self) -> None:
        """Keep this worker's problems in Redis while they last (the heartbeat renews them; a dead
        worker's expire), where a client that hears no answer finds the reason."""
        with contextlib.suppress(Exception):  # Redis away: the next heartbeat publishes them
            key = problems_key(self.settings.service.redis_prefix, self.node)
            if self._problems:
                ttl = max(30, int(self.heartbeat.every_s * 3))
                self.raw.set(key, json.dumps(self.problems()), ex=ttl)
            else:
                self.raw.delete(key)

    def engines(self) -> list[dict[str, Any]]:
        """The engines this process sends work to, each with whether it answers (the health check)."""
        from arrcoc.service.host.engine_process import EngineClient

        host = self.host()
        if isinstance(host, EngineClient):
            return host.engines()
        return [{"address": None, "up": True, "pid": os.getpid(), "device": str(host.pipeline.device)}]

    def store(self) -> RedisJobStore:
        with self._lock:
            if self._store is None:
                s = self.settings
                self._store = RedisJobStore(
                    redis_client(s.service.queue_url, s.service.redis_timeout_s), s.service.redis_prefix
                )
                self._raw = redis_client(
                    s.service.queue_url, s.service.redis_timeout_s, decode_responses=False
                )
        return self._store

    @property
    def raw(self):
        self.store()
        return self._raw

    def on_start(self, node: str | None = None) -> None:
        """Once per worker (`node`: its Celery node name): the reaper of expired jobs' files, and
        the API token's hash where `arrcoc submit/job` checks tokens (arrcoc.service.access)."""
        from arrcoc.service.access import publish_token
        from arrcoc.service.jobs.files import Reaper, sweep_unreachable

        self.node = node or self.node
        self.heartbeat.start()
        if getattr(self, "_reaper", None) is None:
            # expired jobs' files, and those of jobs nobody can fetch (Redis lost their records)
            self._reaper = Reaper(
                self.settings, [lambda: sweep_unreachable(self.settings, self.store(), False)]
            ).start()
        try:
            publish_token(self.store().r, self.settings)
        except Exception as e:  # noqa: BLE001 -- Redis not up yet: the worker still starts
            log.warning("could not publish the API token's hash: %s", e)

    def close(self) -> None:
        self.heartbeat.stop()
        self._problems.clear()
        self.publish_problems()
        if getattr(self, "_reaper", None) is not None:
            self._reaper.stop()
        if self._host is not None:
            self._host.close()

    # -- tasks ---------------------------------------------------------------------------------
    def _attempts_key(self, task_id: str) -> str:
        return f"{self.settings.service.redis_prefix}:attempts:{task_id}"

    def delivery(self, task_id: str, image_key: str) -> tuple[int, bytes | None]:
        """Deliveries of this task so far (a worker that died mid-task makes it come back) and its
        image's bytes (None once expired): one round trip."""
        key = self._attempts_key(task_id)
        pipe = self.raw.pipeline(transaction=False)
        pipe.incr(key)
        # only for cleanup: it must outlive every redelivery, however slow workers are to restart
        pipe.expire(
            key,
            max(3600, self.settings.jobs.visibility_timeout_s * (self.settings.jobs.max_redeliveries + 2)),
        )
        pipe.get(image_key)
        n, _, data = pipe.execute()
        return int(n), data

    def infer(
        self,
        task_id: str,
        key: str,
        query: str,
        controls: dict | None,
        deadline: float | None,
        backend: str | None = None,
        reply_to: str | None = None,
    ) -> dict[str, Any] | None:
        """One interactive request. Its answer, result or error, goes to the client's reply list
        `reply_to` as a frame (arrcoc.service.codec), with the delivery count forgotten in the same
        round trip; a message that names no reply list (sent by an older client) is answered
        through Celery's result backend, as the returned document."""
        s = self.settings
        if reply_to is not None and not reply_to.startswith(f"{s.service.redis_prefix}:reply:"):
            # never written to: a message names no key of the service but a reply list
            raise ArrcocError(f"The request named {reply_to!r} as its reply list, not a key of this service.")
        cpu0, t0 = time.thread_time(), time.perf_counter()
        try:
            n, data = self.delivery(task_id, key)
            if n > s.jobs.max_redeliveries:
                raise ArrcocError(
                    f"This request stopped the worker {n - 1} times (crash or out of memory);"
                    " it was dropped. Try a smaller image."
                )
            timeout = (deadline - time.time()) if deadline else float(s.jobs.task_time_limit_s)
            if timeout <= 0:
                raise ArrcocError("The request waited past its deadline in the queue; try again.")
            if data is None:
                raise ArrcocError(
                    "The image expired before a worker picked it up (queue too long); submit again."
                )
            # decoded once, where it is resized (a bad image raises ImageError there)
            result = self.loaded_host().infer(data, query, Controls.from_wire(controls), timeout, backend)
            # the task thread's own CPU (waits excluded) and its wall time: a client's latency minus
            # task_wall_ms is what the queue, Celery and the result's way back cost
            task = {
                "task_cpu_ms": (time.thread_time() - cpu0) * 1e3,
                "task_wall_ms": (time.perf_counter() - t0) * 1e3,
            }
            result = dataclasses.replace(result, timings_ms=result.timings_ms | task)
            answer: RelevanceResult | BaseException = result
        except Exception as e:  # noqa: BLE001 -- the client hears of every failure (a bug too), never waits it out
            if reply_to is None and not isinstance(e, ArrcocError):
                raise  # Celery's result backend tells the older client
            answer = e
        if reply_to is None:
            with contextlib.suppress(Exception):  # finished (the worker did not die): forget the count
                self.raw.delete(self._attempts_key(task_id))
            return (
                {"error": error_to_wire(answer)}
                if isinstance(answer, BaseException)
                else {"result": result_to_wire(answer)}
            )
        frame = error_to_frame(answer) if isinstance(answer, BaseException) else result_to_frame(answer)
        pipe = self.raw.pipeline(transaction=False)
        pipe.rpush(reply_to, frame)
        # a reply nobody waits for any more goes, as the image does
        pipe.expire(reply_to, s.service.image_ttl_s)
        pipe.delete(self._attempts_key(task_id))
        pipe.execute()
        return None

    def _owner(self, job_id: str) -> str:
        """Whose job this is (the fair gate's key); the job itself when the store does not say."""
        try:
            return self.store().record(job_id).get("owner") or job_id
        except Exception:  # noqa: BLE001 -- Redis blinked or the job is gone: the chunk says so itself
            return job_id

    def check_job_data(self, job_id: str) -> None:
        """DataUnreachable, after GIVE_BACK_WAIT_S, when a live job's folder is not in this worker's
        data directory (recorded as this worker's problem until it sees a job's folder again); a
        job that is over or unknown goes on to run_chunk, which says so."""
        s = self.settings
        folder = job_dir(s, job_id)
        if os.access(folder, os.R_OK | os.W_OK | os.X_OK):
            self._set_problem("data", None)
            return
        try:
            if JobState(self.store().record(job_id)["state"]).finished:
                return
        except Exception:  # noqa: BLE001 -- an unknown job, Redis away: run_chunk says what is wrong
            return
        reason = (
            f"it cannot read batch jobs' data: {folder} is not there or not readable (ARRCOC_SERVICE__DATA_DIR="
            f"{s.service.data_dir}; is the shared job data directory mounted here?); it gives their chunks back"
        )
        self._set_problem("data", reason)
        log.error("batch job %s: %s", job_id, reason)
        time.sleep(GIVE_BACK_WAIT_S)
        raise DataUnreachable(reason)

    @contextlib.contextmanager
    def _following(self, leave_turn):
        """Whether a chunk that began its job may go on writing its results.zip while the job's
        other chunks run (arrcoc.service.jobs.finishing.follow): its turn at the device is over
        (the turn goes to the next chunk), and at most FOLLOWERS chunks of this process follow."""
        leave_turn()
        allowed = self._followers.acquire(blocking=False)
        try:
            yield allowed
        finally:
            if allowed:
                self._followers.release()

    def batch_chunk(self, job_id: str, start: int, stop: int) -> dict[str, Any]:
        s = self.settings
        self.check_job_data(job_id)
        with self.chunk_gate.turn(self._owner(job_id)) as leave_turn:
            deadline = time.monotonic() + s.jobs.task_time_limit_s  # from its turn: waiting is not working
            try:
                with self.heartbeat.chunk(job_id, start, stop):
                    out = _riding_out_redis(
                        lambda: batch.run_chunk(
                            job_id,
                            start,
                            stop,
                            self.loaded_host(),
                            self.store(),
                            s,
                            deadline,
                            following=lambda: self._following(leave_turn),
                        )
                    )
            except TRANSPORT_ERRORS:
                raise  # Redis or the engine process gone: the chunk is tried again
            except Exception as e:  # noqa: BLE001 -- never a job left "running": its items fail with the reason
                log.exception("batch job %s, items %d-%d: the chunk failed", job_id, start, stop)
                reason = reason_for(e)
                _riding_out_redis(lambda: fail_unrecorded(job_id, start, stop, self.store(), s, reason))
                try:
                    maybe_finalize(job_id, self.store(), s)
                except Exception as again:  # noqa: BLE001 -- e.g. the disk still full: the job still ends
                    log.warning("batch job %s: could not finish its results (%s)", job_id, again)
                    self.store().set_state(
                        job_id,
                        JobState.FAILED,
                        reason_for(again),
                        expect=(JobState.PENDING, JobState.RUNNING),
                    )
                out = {"job_id": job_id, "error": reason}
            with contextlib.suppress(Exception):  # finished done, it was released as it was marked so
                if JobState(self.store().record(job_id)["state"]) in (JobState.CANCELLED, JobState.FAILED):
                    release(job_dir(s, job_id))  # over: its inputs go, its reservation shrinks to its results
            return out

    def bench(self, job_id: str) -> dict[str, Any]:
        s = self.settings
        store = self.store()
        name = f"{s.service.redis_prefix}:lock:device:{socket.gethostname()}:{s.engine.device}"

        @contextlib.contextmanager
        def device_lock():
            lock = store.r.lock(
                name, timeout=s.jobs.task_time_limit_s, blocking_timeout=s.jobs.task_time_limit_s
            )
            if not lock.acquire():
                raise ArrcocError(
                    f"The device stayed busy for {s.jobs.task_time_limit_s} s; the benchmark gave up."
                )
            try:
                yield
            finally:
                with contextlib.suppress(Exception):
                    lock.release()

        with self.chunk_gate.turn(self._owner(job_id)):
            return _riding_out_redis(
                lambda: bench.run_bench_job(job_id, self.loaded_host(), store, s, device_lock)
            )
