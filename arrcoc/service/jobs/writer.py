"""Where a batch job's parts are written: a child process, or a thread.

Writing a step (each result's JSON, the part's zip, its CRCs) is Python work that holds the GIL:
in the engine's process it slowed the engine host's decoding and encoding by as much as it cost
(scripts/batch_probe.py: one core and a half busy of 16, the stages stretching together). In a
child process it runs beside them. One child per process, started on first use and kept (a start
costs an interpreter, ~0.2 s); the step crosses to it pickled (its overlays' bytes and results,
a few MB) as columns (`Columns`): each of the results' arrays stacked over the step's items, so
that pickling it, which holds this process's GIL, handles ~11 arrays a step instead of ~11 an
item (a GIL profile of the H100 job put a fifth of its samples in pickling the step:
benchmarks/2026-11-25-h100-gil-profiles/). Should the child die, the step is written in the
calling thread and the next one starts a new child.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...result import RelevanceResult
from ..host.interface import Processed
from .parts import ItemKey, WrittenStep, write_step

log = logging.getLogger(__name__)


class PartWriter:
    """Writes steps' parts off the calling thread; `process`: in the child process, else in a thread."""

    def __init__(self, process: bool):
        # a daemonic process (e.g. a multiprocessing pool's worker) may not start children
        self.process = process and not multiprocessing.current_process().daemon
        self._threads = ThreadPoolExecutor(1, thread_name_prefix="arrcoc-write")

    def submit(self, jd: Path, keys: Sequence[ItemKey], items: Sequence[Processed], ext: str) -> PendingStep:
        """The step's part written, in the background."""
        keys, items = list(keys), list(items)
        args = (jd, keys, items, ext)
        if self.process:
            try:
                return PendingStep(_child().submit(_write_columns, jd, keys, Columns.of(items), ext), args)
            except (BrokenProcessPool, RuntimeError, OSError) as e:  # no child to be had: this process
                log.warning("part writer process unavailable (%s); writing in a thread", e)
                _reset_child()  # the next step asks for a new one
        return PendingStep(self._threads.submit(write_step, *args), args)

    def close(self) -> None:
        self._threads.shutdown(wait=True)


class PendingStep:
    """A step being written; `result()` waits for it."""

    def __init__(self, future: Future[WrittenStep], args: tuple[Path, list[ItemKey], list[Processed], str]):
        self.future, self.args = future, args

    def result(self) -> WrittenStep:
        """The written step; one whose child died is written again here (a part written twice is
        harmless: the later one wins, with the same rows)."""
        try:
            return self.future.result()
        except BrokenProcessPool:
            log.warning("part writer process died; writing the step in this thread")
            _reset_child()
            return write_step(*self.args)


CHILD_WORKERS = 2  # one per chunk written at a time in this process (a worker's threads run several)
_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None


def _child() -> ProcessPoolExecutor:
    """This process's writer child. forkserver: a fresh interpreter forked from a clean server,
    not from this process (its threads and CUDA context); it preloads the part writer only."""
    global _pool
    with _lock:
        if _pool is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload([__name__])
            _pool = ProcessPoolExecutor(CHILD_WORKERS, mp_context=ctx)
        return _pool


def _reset_child() -> None:
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


# Result fields a part does not hold (its rows are RelevanceResult.to_json, which leaves the
# texture out): not sent to the child. The textures (13 x 32 x 32 float32 an item) are 3.4 MB of a
# step of 64, stacked and pickled holding this process's GIL.
UNWRITTEN = ("texture",)
_EMPTY = np.empty(0, np.float32)


@dataclass(frozen=True)
class Columns:
    """A step's items for the child process, column by column: each result field whose values
    are arrays of one shape and dtype over the step as one stacked array, every other field (and
    an array field that differs) as a list, UNWRITTEN fields left out (empty in the child); the
    items' errors and overlays as lists."""

    results: list[int]  # the positions of the items that have a result
    fields: dict[str, np.ndarray | list[Any]]
    errors: list[dict[str, str] | None]
    overlays: list[bytes | None]

    @classmethod
    def of(cls, items: Sequence[Processed]) -> Columns:
        have = [i for i, p in enumerate(items) if p.result is not None]
        fields: dict[str, np.ndarray | list[Any]] = {}
        for f in dataclasses.fields(RelevanceResult) if have else ():
            if f.name in UNWRITTEN:
                continue
            values = [getattr(items[i].result, f.name) for i in have]
            first = values[0]
            same = isinstance(first, np.ndarray) and all(
                isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values
            )
            fields[f.name] = np.stack(values) if same else values
        return cls(have, fields, [p.error for p in items], [p.overlay for p in items])

    def items(self) -> list[Processed]:
        """The step's items as they were (each result's arrays views of the stacked ones)."""
        results: dict[int, RelevanceResult] = {
            i: RelevanceResult(**{name: values[k] for name, values in self.fields.items()},
                               **dict.fromkeys(UNWRITTEN, _EMPTY))
            for k, i in enumerate(self.results)
        }  # fmt: skip
        return [Processed(result=results.get(i), error=e, overlay=o)
                for i, (e, o) in enumerate(zip(self.errors, self.overlays, strict=True))]  # fmt: skip


def _write_columns(jd: Path, keys: list[ItemKey], columns: Columns, ext: str) -> WrittenStep:
    """The child's side of `PartWriter.submit`: the step's items rebuilt, then written."""
    return write_step(jd, keys, columns.items(), ext)
