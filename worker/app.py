"""The Celery app and its signal handlers. One engine per worker process, built where it is used.

Pools: `threads` (the default; dynamic batching needs concurrent tasks in one process) and `solo`
build the engine in the worker process itself once it is ready; `prefork` builds it in each child
after the fork (worker_process_init), so CUDA is never initialised in a process that forks.
"""

from __future__ import annotations

import logging
import threading

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


_pool = {"name": ""}


@signals.worker_init.connect
def _remember_pool(sender=None, **_) -> None:  # sender: the WorkController, before any fork
    cls = getattr(sender, "pool_cls", "")
    _pool["name"] = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__name__', cls)}".lower()


@signals.worker_ready.connect
def _warm_main(**_) -> None:  # threads/solo: tasks run in this process, so warm it here
    if "prefork" in _pool["name"] or "processes" in _pool["name"]:
        return  # children build their own (worker_process_init); this parent must stay CUDA-free
    from .tasks import state

    threading.Thread(target=lambda: state.runtime().warm(), name="arrcoc-warmup", daemon=True).start()


@signals.worker_shutdown.connect
def _close(**_) -> None:
    from .tasks import state

    state.close()
