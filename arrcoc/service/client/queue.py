"""The queue contract the Celery executor shares with worker/: task names, priorities, and the
Celery configuration both sides need (broker, JSON serialisers, transport options). worker/config.py
adds the worker-only part (pool, concurrency, time limits, events) on top.

JSON only (no pickle). Acks are late, and a message whose worker died is redelivered (after
`visibility_timeout_s` on Redis, which a live worker keeps renewing for what it holds) up to a cap
kept in the job store.
"""

from __future__ import annotations

from typing import Any

from ...settings import Settings

TASK_INFER = "arrcoc.infer"
TASK_CHUNK = "arrcoc.batch_chunk"
TASK_BENCH = "arrcoc.bench"
TASKS = (TASK_INFER, TASK_CHUNK, TASK_BENCH)

# Redis priorities: 0 is served first. Interactive requests overtake queued batch chunks.
PRIORITY_INFER = 0
PRIORITY_CHUNK = 6

# kombu's Redis transport keeps each delivered, unacknowledged message's delivery time in this
# sorted set and restores a message once its time is `visibility_timeout_s` old: a worker renews
# the times of the messages it holds (worker/state.py, Heartbeat), so the timeout can be short
# (a dead worker's chunk comes back within it) while a long chunk runs on.
UNACKED_INDEX = "unacked_index"


def problems_key(prefix: str, node: str = "*") -> str:
    """Where a worker keeps what stops it serving (a model that cannot load, a job data directory it
    cannot read) while it lasts, with a TTL its heartbeat renews: the client names the reason when
    no answer comes. `node` "*": the pattern of every worker's."""
    return f"{prefix}:worker-problems:{node}"


def queue_config(settings: Settings) -> dict[str, Any]:
    """What sender and worker must agree on."""
    timeout = settings.service.redis_timeout_s
    return {
        "broker_url": settings.service.queue_url,
        "result_backend": settings.service.results_backend or settings.service.queue_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_default_queue": settings.service.queue_gpu,
        "task_routes": {
            TASK_INFER: {"queue": settings.service.queue_gpu},
            TASK_CHUNK: {"queue": settings.service.queue_gpu},
            TASK_BENCH: {"queue": settings.service.queue_bench},
        },
        "result_expires": settings.jobs.result_expires_s,
        "result_extended": False,
        # no STARTED state and no task-sent event: each is one more Redis write per message, and
        # nothing here reads them (Flower turns workers' events on itself when it connects)
        "task_track_started": False,
        "task_send_sent_event": False,
        "broker_connection_retry_on_startup": True,
        "broker_connection_timeout": timeout,
        "broker_transport_options": {
            "visibility_timeout": settings.jobs.visibility_timeout_s,
            "unacked_index_key": UNACKED_INDEX,
            "unacked_restore_interval": max(1, min(10, settings.jobs.visibility_timeout_s // 4)),
            "unacked_restore_throttle": 1,
            # a worker SIGKILLed while it held the restore mutex would block every redelivery for
            # kombu's default 300 s; tasks are idempotent, so a short mutex is safe
            "unacked_mutex_expire": max(2, min(300, settings.jobs.visibility_timeout_s // 2)),
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "priority_steps": list(range(10)),
            "queue_order_strategy": "priority",
        },
        "task_publish_retry_policy": {
            "max_retries": 3,
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 1.0,
        },
        "redis_socket_timeout": timeout,
        "redis_socket_connect_timeout": timeout,
        "redis_retry_on_timeout": False,
        "result_backend_transport_options": {"retry_policy": {"timeout": timeout}},
    }


def client_app(settings: Settings):
    """A Celery app that only sends tasks and reads results (the executor's side)."""
    from celery import Celery

    app = Celery("arrcoc-client", set_as_current=False)
    app.config_from_object(queue_config(settings))
    return app
