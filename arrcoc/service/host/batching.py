"""Dynamic batching: coalesce concurrent requests into one engine call (Triton-style).

Callers `submit()` an item from any thread and wait on the returned Future. One batching thread
takes the first waiting item, then keeps collecting until `max_batch` items are in hand or
`max_delay_s` has passed since that first item arrived, and runs them as one batch. Under load
the backlog that queued during the last batch runs at once; when idle a request waits at most
`max_delay_s`.

With `prepare_batch` (on a GPU: decode a batch's JPEGs) the batching thread runs a pipeline on its
own: it starts batch k on the device (`launch_batch`), gathers batch k+1 from what queued meanwhile
while the device runs, waits for batch k and hands its results out, then prepares batch k+1 — and
while that decodes (nvJPEG holds no GIL) batch k's callers send their next requests, which batch
k+2 gathers at once. Two threads handing batches to each other under one GIL take turns more than they overlap
(docs/service.md#concurrency). A batch
gathers while the device is busy and as long as callers keep arriving; with the device idle, what
has queued goes at once.
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
from ...tuning import IDLE_GATHER_S

log = logging.getLogger(__name__)


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
# launch_batch(items) -> a function that waits for the batch started: one result or exception per item
LaunchBatch = Callable[[list[Any]], Callable[[], Sequence[Any]]]


def _at_once(run_batch: RunBatch) -> LaunchBatch:
    """run_batch as a launch: run now, the results ready when asked for."""

    def launch(items: list[Any]) -> Callable[[], Sequence[Any]]:
        results = run_batch(items)
        return lambda: results

    return launch


class DynamicBatcher:
    def __init__(
        self,
        run_batch: RunBatch,
        max_batch: int = 32,
        max_delay_s: float = 0.005,
        name: str = "batcher",
        idle_wait: bool = False,
        prepare_batch: PrepareBatch | None = None,
        launch_batch: LaunchBatch | None = None,
    ):
        assert max_batch >= 1 and max_delay_s >= 0
        self.run_batch = run_batch
        self.prepare_batch = prepare_batch
        self.launch_batch = launch_batch or _at_once(run_batch)
        self.idle_wait = idle_wait
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.submitted = 0  # requests ever submitted
        self._last_size = 0  # the size of the last batch gathered
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._closed = False
        loop = self._loop if prepare_batch is None else self._pipelined_loop
        self._thread = threading.Thread(target=loop, name=name, daemon=True)
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

    # -- gathering a batch -------------------------------------------------------------------
    def _collect(self, first: _Request) -> list[_Request]:
        """A batch that starts with `first`, the device idle."""
        batch = [first]
        if not self.idle_wait and self._last_size <= 1 and self._queue.empty():
            # low load (the last batch was one request, and nobody else is waiting): run it at
            # once; waiting for company that is not coming only adds the delay to its latency.
            # Under load batches are larger, and the delay gathers them.
            return batch
        # the delay counts from when the first request arrived (Triton's max queue delay): one that
        # already waited out a running batch goes with whatever else queued meanwhile, at once
        until = first.enqueued + self.max_delay_s
        if self.prepare_batch is not None and not self.idle_wait:
            # nothing runs on the device: gathering longer only adds to every caller's latency
            until = min(until, first.enqueued + IDLE_GATHER_S)
        return self._more(batch, until, None)

    def _gather(self) -> list[_Request]:
        """The next batch while one runs on the device: what has queued, and whoever keeps
        arriving (under load, the callers of the batch handed out last are sending their next)."""
        wait = IDLE_GATHER_S if self._last_size > 1 else 0.0  # at low load nobody is coming
        try:
            first = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
        except queue.Empty:
            return []
        if first is None:
            self._queue.put(None)
            return []
        return self._more([first], first.enqueued + self.max_delay_s, IDLE_GATHER_S)

    def _more(self, batch: list[_Request], until: float, gap: float | None) -> list[_Request]:
        """Add to `batch` until it is full, `until` passes or, with `gap`, nobody arrived for that long."""
        while len(batch) < self.max_batch:
            remaining = until - time.monotonic()
            if gap is not None:
                remaining = min(remaining, gap)
            try:
                req = self._queue.get(timeout=remaining) if remaining > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if req is None:  # closing: finish this batch first
                self._queue.put(None)
                break
            batch.append(req)
        return batch

    def _live(self, batch: list[_Request]) -> list[_Request]:
        """The batch without requests cancelled or past their deadline (those are told why)."""
        now = time.monotonic()
        live = []
        for req in batch:
            if req.future.set_running_or_notify_cancel() is False:
                continue
            if req.deadline is not None and now > req.deadline:
                req.future.set_exception(
                    DeadlineExceeded("The request waited too long in the queue; try again.")
                )
            else:
                live.append(req)
        if live:
            self._last_size = len(live)
        return live

    # -- running -------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            live = self._live(self._collect(first))
            if live:
                self._hand_out(live, self._call(self.run_batch, live, [r.item for r in live]))
        self._fail_queued()

    def _pipelined_loop(self) -> None:
        """Start batch k on the device, gather batch k+1, hand batch k out, prepare batch k+1; repeat."""
        ahead: tuple[list[_Request], list[Any]] | None = None  # prepared, to run next
        closing = False
        while ahead is not None or not closing:
            running = self._launch(*ahead) if ahead is not None else None
            live, closing = self._next_batch(running is not None, closing)
            if running is not None:  # handed out before the next batch is prepared: while it
                self._finish(*running)  # decodes (nvJPEG holds no GIL) these callers send their next
            ahead = self._prepared(live)
        self._fail_queued()

    def _next_batch(self, busy: bool, closing: bool) -> tuple[list[_Request], bool]:
        """The next batch's live requests, and whether the batcher is closing: gathered while the
        device is busy, else waited for (until close() says stop)."""
        if busy:
            return self._live(self._gather()), closing
        if closing:
            return [], True
        first = self._queue.get()
        if first is None:
            return [], True
        return self._live(self._collect(first)), False

    def _prepared(self, live: list[_Request]) -> tuple[list[_Request], list[Any]] | None:
        """prepare_batch over the live requests: those that failed hear why; None if none is left."""
        if not live:
            return None
        ready = self._ready(live, self._call(self.prepare_batch, live, [r.item for r in live]))
        return ready if ready[0] else None

    def _finish(self, live: list[_Request], wait: Callable[[], Sequence[Any]]) -> None:
        """Wait for a launched batch and hand its results out."""
        self._hand_out(live, self._call(lambda _: wait(), live, []))

    def _launch(
        self, live: list[_Request], items: list[Any]
    ) -> tuple[list[_Request], Callable[[], Sequence[Any]]]:
        try:
            return live, self.launch_batch(items)
        except BaseException as e:  # noqa: BLE001 -- every caller of the batch hears why
            log.exception("batch of %d failed to start", len(live))
            failed = [e] * len(live)
            return live, lambda: failed

    @staticmethod
    def _ready(live: list[_Request], prepared: Sequence[Any]) -> tuple[list[_Request], list[Any]]:
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

    @staticmethod
    def _hand_out(live: list[_Request], results: list[Any]) -> None:
        for req, res in zip(live, results, strict=True):
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
