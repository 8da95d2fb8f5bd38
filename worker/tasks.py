"""The tasks: JSON-safe arguments (never image bytes: a Redis key or a job id), thin wrappers
over worker/state.py. New parameters get defaults so queued messages keep working."""

from __future__ import annotations

from celery.exceptions import Reject

from arrcoc.errors import ServiceUnavailableError
from arrcoc.service.client.queue import TASK_BENCH, TASK_CHUNK, TASK_INFER

from .app import app, state
from .state import DataUnreachable

# transient: Redis blinked. Retried with exponential backoff and jitter.
_TRANSIENT = dict(
    autoretry_for=(ServiceUnavailableError, ConnectionError),
    retry_backoff=True,
    retry_backoff_max=30,
    retry_jitter=True,
    max_retries=5,
)


# the client sends with ignore_result and hears the answer on its reply list (worker/state.py)
@app.task(name=TASK_INFER, bind=True)
def infer(
    self,
    image_key: str,
    query: str,
    controls: dict | None = None,
    deadline: float | None = None,
    backend: str | None = None,
    reply_to: str | None = None,
) -> dict | None:
    return state.infer(self.request.id, image_key, query, controls, deadline, backend, reply_to)


# job state lives in the job store: chunk and bench results are not kept in the result backend
@app.task(name=TASK_CHUNK, bind=True, ignore_result=True, **_TRANSIENT)
def batch_chunk(self, job_id: str, start: int, stop: int) -> dict:
    try:
        return state.batch_chunk(job_id, start, stop)
    except DataUnreachable as e:  # back to the queue for a worker that sees the data; no attempt counted
        raise Reject(str(e), requeue=True) from e


@app.task(name=TASK_BENCH, bind=True, ignore_result=True, **_TRANSIENT)
def bench(self, job_id: str) -> dict:
    return state.bench(job_id)
