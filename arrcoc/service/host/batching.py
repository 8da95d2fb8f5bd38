"""The gather stage: concurrent requests into one engine call (Triton-style dynamic batching).

Callers `submit()` an item from any thread and wait on the returned Future. The batcher's one
thread runs the engine host's pipeline for them (`arrcoc.service.host.stages`): it gathers a
batch, decodes it (`stages.decode`), starts it on the device (`stages.engine`) and hands its
results out. A batch gathers until `max_batch` items are in hand or `max_delay_s` has passed
since its first arrived; under load the backlog that queued during the last batch goes at once;
when idle a request waits at most `max_delay_s`.

With `stages.overlap` (on a GPU that decodes JPEGs) the one thread overlaps the stages: it
starts batch k on the device, gathers batch k+1 from what queued meanwhile while the device runs,
waits for batch k and hands its results out, then decodes batch k+1 — and while that decodes
(nvJPEG holds no GIL) batch k's callers send their next requests, which batch k+2 gathers at
once. Two threads handing batches to each other under one GIL take turns more than they overlap
(docs/service.md#concurrency). A batch gathers while the device is busy and as long as callers
keep arriving; with the device idle, what has queued goes at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...errors import ArrcocError, DeadlineExceeded
from ...tuning import IDLE_GATHER_S

log = logging.getLogger(__name__)


@dataclass
class _Request:
    item: Any
    future: Future
    deadline: float | None  # time.monotonic() after which nobody waits for it
    enqueued: float = field(default_factory=time.monotonic)


class BatchStages(Protocol):
    """What the gather stage runs a batch through (arrcoc.service.host.stages.Stages)."""

    # whether the engine runs a batch while the next gathers and decodes (a GPU that decodes JPEGs)
    overlap: bool

    def decode(self, items: list[Any]) -> Sequence[Any]:
        """Per item the item ready for the engine, or the exception it failed with."""
        ...

    def engine(self, items: list[Any]) -> Callable[[], Sequence[Any]]:
        """Start the batch; the returned function waits for it: one result or exception per item."""
        ...


class DynamicBatcher:
    def __init__(
        self,
        stages: BatchStages,
        max_batch: int = 32,
        max_delay_s: float = 0.005,
        name: str = "batcher",
        idle_wait: bool = False,
    ):
        assert max_batch >= 1 and max_delay_s >= 0
        self.stages = stages
        self.idle_wait = idle_wait
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.submitted = 0  # requests ever submitted
        self._last_size = 0  # the size of the last batch gathered
        # the C queue: callers put and the batcher gathers without a Python-level lock between them
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
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

    # -- the one loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        """Start the decoded batch on the device, gather the next, hand the started one out,
        decode the next; repeat. Without `overlap` the started batch is handed out before the next
        gathers (the engine ran it already)."""
        ahead: tuple[list[_Request], list[Any]] | None = None  # decoded, to run next
        closing = False
        while ahead is not None or not closing:
            running = self._engine(*ahead) if ahead is not None else None
            busy = running is not None and self.stages.overlap  # the device runs it meanwhile
            if running is not None and not busy:
                self._finish(*running)
            batch = None if closing else self._gather(busy)
            closing = closing or batch is None
            if busy:  # handed out before the next batch decodes: while it decodes (nvJPEG
                self._finish(*running)  # holds no GIL) these callers send their next requests
            ahead = self._decoded(self._live(batch or []))
        self._fail_queued()

    # -- gather ------------------------------------------------------------------------------
    def _gather(self, busy: bool) -> list[_Request] | None:
        """The next batch (None: the batcher is closing). With the device `busy`: what has queued
        and whoever keeps arriving (under load, the callers of the batch handed out last are
        sending their next), empty if nobody is there. With it idle: the first request waited
        for, then company until the delay since it arrived (Triton's max queue delay: one that
        already waited out a running batch goes with whatever queued meanwhile, at once)."""
        if busy:
            wait = IDLE_GATHER_S if self._last_size > 1 else 0.0  # at low load nobody is coming
            try:
                first = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
            except queue.Empty:
                return []
        else:
            first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        until, gap = first.enqueued + self.max_delay_s, None
        if busy:
            gap = IDLE_GATHER_S
        elif not self.idle_wait and self._last_size <= 1 and self._queue.empty():
            # low load (the last batch was one request, and nobody else is waiting): run it at
            # once; waiting for company that is not coming only adds the delay to its latency.
            # Under load batches are larger, and the delay gathers them.
            return batch
        elif self.stages.overlap and not self.idle_wait:
            # nothing runs on the device: gathering longer only adds to every caller's latency
            until = min(until, first.enqueued + IDLE_GATHER_S)
        return self._more(batch, until, gap)

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

    # -- decode, engine, hand out -----------------------------------------------------------
    def _decoded(self, live: list[_Request]) -> tuple[list[_Request], list[Any]] | None:
        """The decode stage over the live requests: those that failed hear why; None if none is left."""
        if not live:
            return None
        ready = self._ready(live, self._call(self.stages.decode, live, [r.item for r in live]))
        return ready if ready[0] else None

    def _finish(self, live: list[_Request], wait: Callable[[], Sequence[Any]]) -> None:
        """Wait for a launched batch and hand its results out."""
        self._hand_out(live, self._call(lambda _: wait(), live, []))

    def _engine(
        self, live: list[_Request], items: list[Any]
    ) -> tuple[list[_Request], Callable[[], Sequence[Any]]]:
        try:
            return live, self.stages.engine(items)
        except BaseException as e:  # noqa: BLE001 -- every caller of the batch hears why
            log.exception("batch of %d failed to start", len(live))
            failed = [e] * len(live)
            return live, lambda: failed

    @staticmethod
    def _ready(live: list[_Request], decoded: Sequence[Any]) -> tuple[list[_Request], list[Any]]:
        """Callers whose item failed to decode hear why; the rest go on, with their decoded items."""
        ok = []
        for req, item in zip(live, decoded, strict=True):
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
