"""InProcessExecutor: no Redis. Threads in this process; batch jobs in the data dir.

Interactive requests go through the same dynamic batcher and engine host pipeline as a Celery
worker; batch and benchmark jobs run on one job thread (the device is one) through the same
functions (`arrcoc.service.jobs`), jobs of different owners taking turns (`FairScheduler`).
Job state lives in memory: it survives a browser refresh, not a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from ...pipeline import RelevancePipeline
from ...request import Controls
from ...result import RelevanceResult
from ...settings import Settings, get_settings
from ...tuning import JOB_STOP_WAIT_S
from ..host.runtime import Runtime
from ..jobs import batch, bench
from ..jobs.archive import PendingArchive
from ..jobs.budget import release
from ..jobs.files import Reaper, job_dir, sweep_unreachable
from ..jobs.finishing import maybe_finalize
from ..jobs.guard import fail_unrecorded, reason_for
from ..jobs.store import MemoryJobStore
from ..jobs.types import BenchRequest, JobState
from .executor import Executor

log = logging.getLogger(__name__)

# a task: given `yield_now` (True once it should let another owner's job run), runs for a while;
# returns True when it is finished, False to be run again after the other owners' turns
Task = Callable[[Callable[[], bool]], bool]


class FairScheduler:
    """One thread running jobs, owners in turn: each owner's jobs in the order they came, and a
    job that ran `slice_s` while another owner waits hands the thread over (a batch job between
    two pipeline steps; a benchmark runs whole, bounded by its own caps). So one big job cannot
    hold everyone's: the others' run between its slices."""

    def __init__(self, slice_s: float, name: str = "arrcoc-job"):
        self.slice_s = slice_s
        self._owners: OrderedDict[str, deque[Task]] = OrderedDict()
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def idle(self) -> bool:
        """No job running or waiting: one added now starts at once."""
        with self._cv:
            return not self._owners

    def add(self, owner: str, task: Task) -> None:
        with self._cv:
            self._owners.setdefault(owner, deque()).append(task)
            self._cv.notify()

    def submit(self, fn: Callable[..., object], *args: object) -> None:
        """A plain callable, run whole in its turn (as the anonymous owner)."""
        self.add("", lambda _yield_now: (fn(*args), True)[1])

    def _others_waiting(self, owner: str) -> bool:
        with self._cv:
            return any(o != owner and q for o, q in self._owners.items())

    def _slice(self, owner: str) -> Callable[[], bool]:
        """`yield_now` for a turn of `owner`'s starting now."""
        t0 = time.monotonic()
        return lambda: time.monotonic() - t0 >= self.slice_s and self._others_waiting(owner)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stopped and not self._owners:
                    self._cv.wait()
                if self._stopped:
                    return
                owner, queue = next(iter(self._owners.items()))
                task = queue[0]
            try:
                finished = task(self._slice(owner))
            except Exception:  # a task that raised is over; the thread goes on
                log.exception("job task failed")
                finished = True
            with self._cv:
                if self._stopped:  # shut down while the task ran: the queues are gone
                    return
                if finished:
                    queue.popleft()
                if queue:
                    self._owners.move_to_end(owner)  # the next owner's turn
                else:
                    self._owners.pop(owner, None)

    def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
        with self._cv:
            self._stopped = True
            if cancel_futures:
                self._owners.clear()
            self._cv.notify_all()
        if wait:
            self._thread.join()

    def join(self, timeout: float) -> None:
        """Wait up to `timeout` s for the thread to end (after `shutdown`)."""
        self._thread.join(timeout)


class InProcessExecutor(Executor):
    def __init__(self, settings: Settings | None = None, pipeline: RelevancePipeline | None = None):
        super().__init__(settings or get_settings(), MemoryJobStore())
        self.runtime = Runtime(self.settings, pipeline)
        self._jobs = FairScheduler(self.settings.jobs.slice_s)
        # expired jobs' files go on time, and those of jobs nobody can fetch (a restart forgot them) early
        store = self.store
        self.reaper = Reaper(
            self.settings, [lambda: sweep_unreachable(self.settings, store, in_memory=True)]
        ).start()

    def warmup(self) -> None:
        """Build and warm the engine now instead of on the first request."""
        self.runtime.warm()

    def infer(
        self,
        image: bytes,
        query: str,
        controls: Controls | None = None,
        timeout: float = 60.0,
        backend: str | None = None,
    ) -> RelevanceResult:
        self._check_types(image, controls)
        return self.runtime.infer(bytes(image), query, controls or Controls(), timeout, backend)

    starts_jobs_unwritten = True

    def _start_batch(self, job_id, chunks, owner, pending):
        total = chunks[-1][1] if chunks else 0
        if pending is not None and not self._jobs.idle():
            pending.write_all()  # it waits its turn: its zip on disk, not in memory
        self._jobs.add(owner or "", lambda yield_now: self._run_batch(job_id, total, yield_now, pending))

    def _run_batch(
        self,
        job_id: str,
        total: int,
        yield_now: Callable[[], bool] | None = None,
        pending: PendingArchive | None = None,
    ) -> bool:
        """The job's items not recorded yet, until `yield_now` says another owner waits; True once
        the job is over. Items are taken in one chunk, not Celery's: chunks are Celery's unit of
        redelivery, which a job thread does not have, and each chunk's pipeline fills and drains anew.
        `pending`: the job's zip while in memory, which its steps read from."""
        try:
            if total:  # finished when its last item is recorded (batch.run_chunk)
                ran = batch.run_chunk(
                    job_id,
                    0,
                    total,
                    self.runtime,
                    self.store,
                    self.settings,
                    yield_now=yield_now,
                    pending=pending,
                )
                if ran.get("yielded"):
                    if pending is not None:
                        pending.write_all()  # it waits its next turn: its zip on disk, not in memory
                    return False
            else:
                maybe_finalize(job_id, self.store, self.settings)
        except Exception as e:  # never leave a job "running": what was not recorded fails with the reason
            log.exception("batch job %s failed", job_id)
            try:
                fail_unrecorded(job_id, 0, total, self.store, self.settings, reason_for(e))
                maybe_finalize(job_id, self.store, self.settings)
            except Exception as again:  # noqa: BLE001 -- e.g. the disk is still full: the job still ends
                log.warning("batch job %s: could not finish its results (%s)", job_id, again)
            self.store.set_state(
                job_id, JobState.FAILED, reason_for(e), expect=(JobState.PENDING, JobState.RUNNING)
            )
        # over: its inputs go, its reservation shrinks to its results (a done job's went as it was marked so)
        if pending is not None:
            pending.drop()
        if JobState(self.store.record(job_id)["state"]) != JobState.DONE:
            release(job_dir(self.settings, job_id))
        return True

    def submit_bench(self, request: BenchRequest, owner: str | None = None) -> str:
        job_id = bench.create_bench_job(request, self.settings, self.store, owner)
        self._jobs.add(owner or "", lambda _yield_now: self._run_bench(job_id))
        return job_id

    def _run_bench(self, job_id: str) -> bool:
        bench.run_bench_job(job_id, self.runtime, self.store, self.settings)
        return True

    def close(self) -> None:
        self.reaper.stop()
        self._jobs.shutdown(wait=False, cancel_futures=True)
        self.runtime.close()  # a job still running fails at its next step, recording why
        # and ends before the interpreter does: a daemon thread still inside torch at exit aborts it
        self._jobs.join(JOB_STOP_WAIT_S)
