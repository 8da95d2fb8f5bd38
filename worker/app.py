"""The Celery app and its signal handlers. One engine per worker process, built where it is used.

Pools: `threads` (the default; dynamic batching needs concurrent tasks in one process) and `solo`
build the engine in the worker process before it consumes anything; `prefork` builds it in each child
after the fork (worker_process_init), so CUDA is never initialised in a process that forks.
"""

from __future__ import annotations

import logging

from celery import Celery, signals

from . import config

app = Celery("arrcoc")
app.config_from_object(config.build())
app.conf.include = ["worker.tasks"]

log = logging.getLogger(__name__)


@signals.worker_process_init.connect
def _warm_child(**_) -> None:  # prefork child: after the fork, before the first task
    from .tasks import state

    state.reset()
    state.runtime().warm()


@signals.celeryd_after_setup.connect
def _warm_before_consuming(sender=None, instance=None, **_) -> None:
    """threads/solo: build and warm the engine in this process before the consumer starts, so no
    message sits unacknowledged behind a cold engine (past the visibility timeout it would be
    delivered again while still running)."""
    cls = getattr(instance, "pool_cls", "")
    pool = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__name__', cls)}".lower()
    if "prefork" in pool or "processes" in pool:
        return  # children build their own (worker_process_init); this parent must stay CUDA-free
    from .tasks import state

    state.runtime().warm()


@signals.worker_shutdown.connect
def _close(**_) -> None:
    from .tasks import state

    state.close()
