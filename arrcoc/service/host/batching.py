"""Dynamic batching: coalesce concurrent requests into one engine call (Triton-style).

Callers `submit()` an item from any thread and wait on the returned Future. One batching thread
takes the first waiting item, then keeps collecting until `max_batch` items are in hand or
`max_delay_s` has passed since that first item arrived, and runs them as one batch. Under load
the backlog that queued during the last batch runs at once; when idle a request waits at most
`max_delay_s`.

With `prepare_batch` the work runs as two stages on two threads: the batching thread prepares a
batch (on a GPU: decodes its JPEGs, on a stream of its own) while the engine thread runs the one
before, so decoding and the engine overlap instead of taking turns; one prepared batch waits at
most (back-pressure). A batch then gathers only while the engine is busy: once the engine is idle
with nothing prepared for it, what has queued goes at once instead of waiting out the delay.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ...errors import ArrcocError, DeadlineExceeded

log = logging.getLogger(__name__)


# With two stages, a batch gathers at least this long, then goes as soon as the engine is idle
# (rather than waiting out the whole delay while the engine has nothing to do); the
# engine is looked at this often while a batch gathers.
IDLE_GATHER_S = 0.0005


@dataclass
class _Request:
    item: Any
    future: Future
    deadline: float | None  # time.monotonic() after which nobody waits for it
    enqueued: float = field(default_factory=time.monotonic)


# run_batch(items) -> one result or one exception per item, in order
RunBatch = Callable[[list[Any]], Sequence[Any]]
# prepare_batch(items) -> per item the item ready to run, or the exception it failed with
PrepareBatch = Callable[[list[Any]], Sequence[Any]]


class DynamicBatcher:
    def __init__(self, run_batch: RunBatch, max_batch: int = 32, max_delay_s: float = 0.005, name: str = "batcher",
                 idle_wait: bool = False, prepare_batch: PrepareBatch | None = None):  # fmt: skip
        assert max_batch >= 1 and max_delay_s >= 0
        self.run_batch = run_batch
        self.prepare_batch = prepare_batch
        self._prepared: queue.Queue[tuple[list[_Request], list[Any]] | None] = queue.Queue(maxsize=1)
        self._engine_busy = False  # the engine thread is running a batch
        self._engine = None
        if prepare_batch is not None:
            self._engine = threading.Thread(target=self._engine_loop, name=f"{name}-engine", daemon=True)
            self._engine.start()
        self.idle_wait = idle_wait
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.submitted = 0  # requests ever submitted
        self._last_size = 0  # the size of the last batch run
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: Any, deadline: float | None = None) -> Future:
        if self._closed:
            raise ArrcocError("The batcher is shut down; the worker is stopping.")
        fut: Future = Future()
        self.submitted += 1
        self._queue.put(_Request(item, fut, deadline))
        return fut

    def close(self, timeout: float = 5.0) -> None:
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout)

    def _collect(self, first: _Request) -> list[_Request]:
        batch = [first]
        if not self.idle_wait and self._last_size <= 1 and self._queue.empty():
            # low load (the last batch was one request, and nobody else is waiting): run it at
            # once; waiting for company that is not coming only adds the delay to its latency.
            # Under load batches are larger, and the delay gathers them.
            return batch
        # the delay counts from when the first request arrived (Triton's max queue delay): one that
        # already waited out a running batch goes with whatever else queued meanwhile, at once
        until = first.enqueued + self.max_delay_s
        two_stage = self.prepare_batch is not None and not self.idle_wait
        while len(batch) < self.max_batch:
            now = time.monotonic()
            remaining = until - now
            if two_stage and now - first.enqueued >= IDLE_GATHER_S and self._downstream_idle():
                # the engine waits for work and nothing is on its way to it: gathering longer
                # only adds to every caller's latency. Take what has queued, and go. (While the
                # engine is busy, waiting costs nothing: the batch could not run sooner anyway.)
                remaining = 0.0
            elif two_stage:  # look again at the engine soon
                remaining = min(remaining, IDLE_GATHER_S)
            try:
                req = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                if time.monotonic() < until and not (two_stage and self._downstream_idle()):
                    continue
                break
            if req is None:  # closing: finish this batch first
                self._queue.put(None)
                break
            batch.append(req)
        return batch

    def _downstream_idle(self) -> bool:
        """The engine thread is waiting for a batch, and none is prepared for it."""
        return not self._engine_busy and self._prepared.empty()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            batch = self._collect(first)
            now = time.monotonic()
            live = []
            for req in batch:
                if req.future.set_running_or_notify_cancel() is False:
                    continue
                if req.deadline is not None and now > req.deadline:
                    req.future.set_exception(DeadlineExceeded("The request waited too long in the queue; try again."))
                else:
                    live.append(req)
            if not live:
                continue
            self._last_size = len(live)
            if self.prepare_batch is None or (len(live) == 1 and not self._engine_busy and self._prepared.empty()):
                # nothing to overlap with (a lone request and an idle engine): both stages here,
                # sparing the hand-over to the engine thread (the single-stage path's latency)
                self._run(live, [r.item for r in live], self.prepare_batch)
                continue
            ready = self._call(self.prepare_batch, live, [r.item for r in live])
            self._prepared.put((live, ready))  # waits while the engine is a batch behind
        if self._engine is not None:
            self._prepared.put(None)
            self._engine.join()
        self._fail_queued()

    def _engine_loop(self) -> None:
        while (prepared := self._prepared.get()) is not None:
            self._engine_busy = True
            try:
                self._run(*self._ready(*prepared))
            finally:
                self._engine_busy = False

    @staticmethod
    def _ready(live: list[_Request], prepared: list[Any]) -> tuple[list[_Request], list[Any]]:
        """Callers whose item failed to prepare hear why; the rest go on, with their prepared items."""
        ok = []
        for req, item in zip(live, prepared, strict=True):
            if isinstance(item, BaseException):
                req.future.set_exception(item)
            else:
                ok.append((req, item))
        return [req for req, _ in ok], [item for _, item in ok]

    @staticmethod
    def _call(fn: Callable[[list[Any]], Sequence[Any]], live: list[_Request], items: list[Any]) -> list[Any]:
        """fn(items), one entry per item; if fn fails as a whole, every item gets its exception."""
        try:
            out = list(fn(items))
            assert len(out) == len(live), "a batch function must return one entry per item"
        except BaseException as e:  # the whole batch failed: every caller hears why
            log.exception("batch of %d failed", len(live))
            out = [e] * len(live)
        return out

    def _run(self, live: list[_Request], items: list[Any], prepare: PrepareBatch | None = None) -> None:
        """run_batch(items) (after `prepare`, if given) and every caller told its result."""
        if prepare is not None:
            live, items = self._ready(live, self._call(prepare, live, items))
        if not live:
            return
        for req, res in zip(live, self._call(self.run_batch, live, items), strict=True):
            if isinstance(res, BaseException):
                req.future.set_exception(res)
            else:
                req.future.set_result(res)

    def _fail_queued(self) -> None:
        # fail whatever is still queued
        while True:
            try:
                req = self._queue.get_nowait()
            except queue.Empty:
                break
            if req is not None and req.future.set_running_or_notify_cancel():
                req.future.set_exception(ArrcocError("The worker is stopping; try again."))
