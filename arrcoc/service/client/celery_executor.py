"""CeleryExecutor: work goes through Redis to GPU workers (`arrcoc worker`).

The submitting side validates inputs, stores image bytes under a content key with a TTL (batch
zips in the data store, which the workers share: a compose volume), and sends only keys and ids.
Every call has a timeout: a dead Redis or no worker gives ServiceUnavailableError, never a hang.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from ..errors import ArrcocError, InvalidInputError
from ..pipeline import Controls
from ..result import RelevanceResult
from ..settings import Settings, get_settings
from . import jobs
from .celery_config import (
    PRIORITY_CHUNK,
    PRIORITY_INFER,
    TASK_BENCH,
    TASK_CHUNK,
    TASK_INFER,
    broker_url,
    client_app,
)
from .codec import error_from_wire, result_from_wire
from .executor import BenchRequest, Executor, JobState, ServiceUnavailableError
from .runtime import check_image_header, controls_to_dict, validate_query_text
from .store import RedisJobStore, redis_client
from .worker_ops import image_key

log = logging.getLogger(__name__)


def _unavailable(e: BaseException, what: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(f"{what}: the queue did not answer ({type(e).__name__}: {e}). "
                                   "Check that Redis and a worker are running, then retry.")  # fmt: skip


class CeleryExecutor(jobs.StoredJobs, Executor):
    def __init__(self, settings: Settings | None = None):
        import redis

        self.settings = s = settings or get_settings()
        self.app = client_app(s)
        self.store = RedisJobStore(redis_client(broker_url(s), s.redis_timeout_s), s.redis_prefix)
        self.raw = redis.Redis.from_url(broker_url(s), socket_timeout=s.redis_timeout_s,
                                        socket_connect_timeout=s.redis_timeout_s)  # fmt: skip

    def _send(self, name: str, args: list, queue: str, priority: int, **options: Any):
        from kombu.exceptions import OperationalError

        try:
            # argsrepr: Celery's generic saferepr of the arguments costs more than the rest of the message
            return self.app.send_task(name, args=args, queue=queue, priority=priority, argsrepr=repr(args),
                                      kwargsrepr="{}", **options)  # fmt: skip
        except (OperationalError, ConnectionError, OSError) as e:
            raise _unavailable(e, "Could not queue the work") from e

    # -- interactive ---------------------------------------------------------------------------
    def infer(self, image: bytes, query: str, controls: Controls | None = None, timeout: float = 60.0,
              backend: str | None = None) -> RelevanceResult:  # fmt: skip
        import redis
        from celery.exceptions import TaskRevokedError
        from celery.exceptions import TimeoutError as CeleryTimeout

        s = self.settings
        check_image_header(image, s)
        text = validate_query_text(query, s)
        key = image_key(s, hashlib.sha256(image).hexdigest())
        try:
            self.raw.set(key, image, ex=s.image_ttl_s)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise _unavailable(e, "Could not store the image") from e
        deadline = time.time() + timeout
        if backend is not None and backend not in s.backends:
            raise InvalidInputError(f"The workers do not serve the {backend!r} backend; they serve"
                                    f" {', '.join(s.backends)} (ARRCOC_BACKENDS).")  # fmt: skip
        res = self._send(TASK_INFER, [key, text, controls_to_dict(controls), deadline, backend], s.queue_gpu,
                         PRIORITY_INFER, expires=timeout)  # fmt: skip
        try:
            doc = res.get(timeout=max(0.1, deadline - time.time()), propagate=True, interval=0.05)
        except (CeleryTimeout, TaskRevokedError):  # revoked: it expired in the queue
            raise ServiceUnavailableError(
                f"No worker answered within {timeout:.0f} s; the workers are busy or not running. Try again."
            ) from None
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise _unavailable(e, "Lost the result") from e
        except ArrcocError:
            raise
        except Exception as e:  # the task itself raised: a worker bug
            raise ArrcocError(f"The worker failed: {type(e).__name__}: {e}") from e
        finally:
            try:
                res.forget()
            except Exception:  # noqa: BLE001 -- best effort: result_expires cleans up too
                pass
        if "error" in doc:
            raise error_from_wire(doc["error"])
        return result_from_wire(doc["result"])

    # -- jobs --------------------------------------------------------------------------------
    def submit_batch(self, archive: bytes, query: str | None = None, controls: Controls | None = None) -> str:
        job_id, chunks = jobs.create_batch_job(archive, query, controls, self.settings, self.store)
        try:
            for start, stop in chunks:
                self._send(TASK_CHUNK, [job_id, start, stop], self.settings.queue_gpu, PRIORITY_CHUNK)
        except ServiceUnavailableError as e:
            self.store.set_state(job_id, JobState.FAILED, str(e))
            raise
        return job_id

    def submit_bench(self, request: BenchRequest) -> str:
        job_id = jobs.create_bench_job(request, self.settings, self.store)
        self._send(TASK_BENCH, [job_id], self.settings.queue_bench, 0)
        return job_id

    def close(self) -> None:
        for closer in (self.raw.close, self.store.r.close, self.app.close):
            try:
                closer()
            except Exception:  # noqa: BLE001
                pass
