"""The demo's one door to the serving side: the Executor from arrcoc.service, created on first use.

Nothing here runs at import. The executor (in-process by default, Celery when ARRCOC_BROKER_URL
is set) is built lazily and shared by every session of the app.
"""

from __future__ import annotations

import inspect
import threading

from arrcoc.errors import EngineError
from arrcoc.pipeline import Controls
from arrcoc.result import RelevanceResult
from arrcoc.service.executor import Executor

_lock = threading.Lock()
_executor: Executor | None = None


def executor() -> Executor:
    """The process-wide executor (built on first call)."""
    global _executor
    with _lock:
        if _executor is None:
            from arrcoc.service.executor import create_executor

            _executor = create_executor()
        return _executor


def set_executor(ex: Executor | None) -> None:
    """Replace the executor (tests; or a host app that owns one)."""
    global _executor
    with _lock:
        _executor = ex


def executor_ready() -> bool:
    """False while no Executor implementation can be imported (jobs tabs then say so)."""
    try:
        from arrcoc.service import inprocess  # noqa: F401
    except ImportError:
        return _executor is not None
    return True


def infer(image: bytes, query: str, controls: Controls, backend: str = "eager") -> RelevanceResult:
    """One image + query through the executor; falls back to a local pipeline until one exists."""
    if executor_ready():
        ex = executor()
        if "backend" in inspect.signature(ex.infer).parameters:
            return ex.infer(image, query, controls, backend=backend)  # type: ignore[call-arg]
        if backend != "eager":
            raise EngineError(
                f"This server runs its default backend only; the {backend!r} backend is chosen by the"
                " worker's settings (ARRCOC_BACKEND). Choose 'eager' here."
            )
        return ex.infer(image, query, controls)
    [result] = _pipeline(backend).infer([image], query, controls)
    return result


_pipelines: dict[str, object] = {}


def _pipeline(backend: str):
    """Interim path (before arrcoc.service.inprocess lands): a local eager pipeline per backend."""
    from arrcoc.pipeline import RelevancePipeline
    from arrcoc.settings import get_settings

    with _lock:
        if backend not in _pipelines:
            s = get_settings()
            pipe = RelevancePipeline(s.variant, s.weights or "default", backend, s.device, buckets=(1,), cache_dir=s.cache_dir)
            pipe.warmup()
            _pipelines[backend] = pipe
        return _pipelines[backend]
