"""The Celery app and its signal handlers. One engine per worker process, built where it is used.

`celery -A worker.app worker` configures it from the environment's settings; `arrcoc worker`
calls `configure(settings)` with its own first. Pools: `threads` (the default; dynamic batching
needs concurrent tasks in one process) and `solo` build the engine in the worker process before it
consumes anything; `prefork` builds it in each child after the fork (worker_process_init), so CUDA
is never initialised in a process that forks.
"""

from __future__ import annotations

import logging

from celery import Celery, signals
from celery.worker.control import inspect_command
from kombu.transport import redis as redis_transport

from arrcoc.settings import Settings, get_settings

from . import config
from .state import WorkerState

app = Celery("arrcoc")
app.conf.include = ["worker.tasks"]
state = WorkerState()  # this process's engine host, Redis clients and job store

log = logging.getLogger(__name__)


class Transport(redis_transport.Transport):
    """kombu's Redis transport, whose channels still reach the broker after Celery has dropped
    their connection. When the broker goes away (a restart), Celery closes the connection, which
    detaches its transport (transport.client = None), and reconnects with a new one. The tasks
    still running acknowledge their messages through the old channel, which reads the broker's
    address from its transport: detached, that read raises AttributeError, which Celery takes for
    an unrecoverable error and stops the worker. This transport keeps the address it was made with."""

    @property
    def client(self):
        return self._client

    @client.setter
    def client(self, value) -> None:
        if value is not None or not hasattr(self, "_client"):
            self._client = value


def configure(settings: Settings) -> None:
    """Point the app and this process's worker state at `settings`."""
    app.config_from_object(config.build(settings))
    state.configure(settings)


configure(get_settings())


@signals.worker_process_init.connect
def _warm_child(**_) -> None:  # prefork child: after the fork, before the first task
    state.reset()  # (the parent started the reaper in celeryd_after_setup)
    state.warm()


@signals.celeryd_after_setup.connect
def _warm_before_consuming(sender=None, instance=None, **_) -> None:
    """threads/solo: build and warm the engine in this process before the consumer starts, so no
    message sits unacknowledged behind a cold engine (past the visibility timeout it would be
    delivered again while still running). Every worker's main process also starts the reaper of
    expired jobs' files (the data store is shared; sweeping twice is harmless)."""
    state.on_start(sender)
    cls = getattr(instance, "pool_cls", "")
    pool = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__name__', cls)}".lower()
    if "prefork" in pool or "processes" in pool:
        return  # children build their own (worker_process_init); this parent must stay CUDA-free
    state.warm()  # a model that cannot load is reported (arrcoc_health), and the worker stays up


@signals.task_received.connect
def _hold(request=None, **_) -> None:
    """Every message this worker takes is kept alive until it is acknowledged (state.heartbeat)."""
    message = getattr(request, "message", None)
    if message is not None:
        state.heartbeat.hold(message)


@signals.worker_shutdown.connect
def _close(**_) -> None:
    state.close()


@inspect_command()
def arrcoc_engines(_panel) -> list[dict]:
    """`app.control.broadcast("arrcoc_engines", reply=True)`: the engines this process sends work
    to, each with whether it answers and what it has served (docker/healthcheck.py asks it)."""
    return state.engines()


@inspect_command()
def arrcoc_health(_panel) -> list[str]:
    """`app.control.broadcast("arrcoc_health", reply=True)`: what stops this worker serving, in
    words (a model that cannot load, a job data directory it cannot read); empty when healthy
    (docker/healthcheck.py fails on any)."""
    return state.problems()
