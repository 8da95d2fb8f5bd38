"""Failure isolation, in one place: a batch that fails runs again item by item.

The engine stage (`arrcoc.service.host.stages.Stages.engine_calls`: interactive batches and batch
job steps alike), a batch job's call of its engine host (`arrcoc.service.jobs.guard`) and the GPU
decoder's nvJPEG call (`arrcoc.preprocess.Decoder`) all go through `isolated`, so one bad item
fails only itself and its neighbours keep their results. No torch here: the Celery side imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def isolated(
    launch: Callable[[list[T]], Callable[[], R]],
    items: Sequence[T],
    fatal: tuple[type[BaseException], ...] = (),
) -> Callable[[], list[tuple[list[int], R | Exception]]]:
    """`launch(items)` (which starts the call and returns a function that waits for it); if
    starting it raises, each item is launched alone and waited for at once, so that one bad item
    fails only itself. Returns a function that waits: per call, its items' positions and its
    outcome (what its wait returned, or the exception it failed with). `fatal` exceptions are
    nobody's item's fault (a transport gone): they raise."""
    items = list(items)
    try:
        wait = launch(items)
    except fatal:
        raise
    except Exception as e:
        if len(items) == 1:
            failed: list[tuple[list[int], R | Exception]] = [([0], e)]
            return lambda: failed
        log.warning(
            "batch of %d failed (%s: %s); running its items one by one", len(items), type(e).__name__, e
        )
        ran = [([i], _alone(launch, item, fatal)) for i, item in enumerate(items)]
        return lambda: ran
    everything = list(range(len(items)))
    return lambda: [(everything, wait())]


def _alone(
    launch: Callable[[list[T]], Callable[[], R]], item: T, fatal: tuple[type[BaseException], ...]
) -> R | Exception:
    try:
        return launch([item])()
    except fatal:
        raise
    except Exception as e:
        return e


def done(value: R) -> Callable[[], R]:
    """A launch's wait for work already finished (a call that is not started and waited for apart)."""
    return lambda: value
