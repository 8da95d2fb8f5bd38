"""The one place that decides in-process or Celery: ARRCOC_SERVICE__BROKER_URL set -> Celery."""

from __future__ import annotations

from ...settings import Settings, get_settings
from .executor import Executor


def create_executor(settings: Settings | None = None) -> Executor:
    """Celery when a broker is configured, otherwise in-process."""
    settings = settings or get_settings()
    if settings.service.broker_url:
        from .celery_executor import CeleryExecutor

        return CeleryExecutor(settings)
    from .inprocess import InProcessExecutor

    return InProcessExecutor(settings)
