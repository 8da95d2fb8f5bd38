"""The worker's Celery configuration: the queue contract (arrcoc.service.client.queue) plus what
only a worker needs. The worker is a thread pool in one process per device, so dynamic batching
can gather concurrent requests; prefetch is 1 per thread."""

from __future__ import annotations

from typing import Any

from arrcoc.service.client.queue import queue_config
from arrcoc.settings import Settings
from arrcoc.tuning import WORKER_THREADS


def worker_threads(settings: Settings) -> int:
    """A Celery process's threads: ARRCOC_ENGINE__WORKER_THREADS; else, when the batch size is set,
    enough to fill a batch (a one-process worker's batches gather from its own threads); else
    WORKER_THREADS."""
    if settings.engine.worker_threads:
        return settings.engine.worker_threads
    if "max_size" in settings.batching.model_fields_set:
        return max(settings.batching.max_size, 1) + 4
    return WORKER_THREADS


def build(settings: Settings) -> dict[str, Any]:
    return queue_config(settings) | {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_pool": "threads",
        "worker_concurrency": worker_threads(settings),
        # prefork pools enforce these; the threads pool cannot, so tasks also keep deadlines themselves
        "task_time_limit": settings.jobs.task_time_limit_s + 30,
        "task_soft_time_limit": settings.jobs.task_time_limit_s,
        "worker_send_task_events": False,  # events cost every task several publishes; Flower enables them
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "broker_transport": "worker.app:Transport",  # survives a broker restart (worker/app.py)
    }
