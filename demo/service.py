"""The demo's one door to the serving side: the Executor from arrcoc.service.client, created on first use.

Nothing here runs at import. The executor (in-process by default, Celery when ARRCOC_SERVICE__BROKER_URL
is set) is built lazily and shared by every session of the app.
"""

from __future__ import annotations

import threading

from arrcoc.request import Controls
from arrcoc.result import RelevanceResult
from arrcoc.service.client.executor import Executor
from arrcoc.service.client.factory import create_executor
from arrcoc.settings import get_settings

_lock = threading.Lock()
_executor: Executor | None = None
_ready: set[str] = set()  # backends that have answered a request from this process


def executor() -> Executor:
    """The process-wide executor (built on first call)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = create_executor()
        return _executor


def set_executor(ex: Executor | None) -> None:
    """Replace the executor (tests; or a host app that owns one). The old one is closed."""
    global _executor
    with _lock:
        old, _executor = _executor, ex
    if old is not None and old is not ex:
        old.close()
    _ready.clear()


def served_backend() -> str:
    """The backend interactive requests run on (the server's ARRCOC_ENGINE__BACKEND)."""
    return get_settings().engine.backend


def is_ready(backend: str) -> bool:
    """Whether a request on this backend will be quick: it has answered before, or a queue's worker
    (built and warmed before it takes work) serves it."""
    return backend in _ready or bool(get_settings().service.broker_url)


def worker_notice() -> str:
    """The page's warning when a worker runs but cannot serve (its model did not load, it cannot
    read the jobs' data): its own words. Empty without a broker (in process, a request says why)."""
    if not get_settings().service.broker_url:
        return ""
    problems = executor().worker_problems()
    return "**The service cannot serve every request now.** " + " ".join(problems) if problems else ""


def infer(image: bytes, query: str, controls: Controls, backend: str | None = None) -> RelevanceResult:
    """One image + query through the executor, on the chosen backend (None: the server's default)."""
    result = executor().infer(image, query, controls, backend=backend)
    _ready.add(backend or served_backend())
    return result
