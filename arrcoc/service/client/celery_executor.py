"""CeleryExecutor: work goes through Redis to GPU workers (`arrcoc worker`).

The submitting side validates inputs, stores image bytes under a content key with a TTL (batch
zips in the data store, which the workers share: a compose volume), and sends only keys and ids.
An interactive request's answer comes back on a reply list of its own (worker/state.py).
Every call has a timeout: a dead Redis or no worker gives ServiceUnavailableError, never a hang.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

from ...errors import ServiceUnavailableError
from ...request import Controls, check_image_header, image_key, validate_query
from ...result import RelevanceResult
from ...settings import Settings, get_settings
from ..codec import result_from_frame
from ..jobs import bench
from ..jobs.store import RedisJobStore, redis_client
from ..jobs.types import BenchRequest, JobState
from .executor import Executor
from .queue import (
    PRIORITY_CHUNK,
    PRIORITY_INFER,
    TASK_BENCH,
    TASK_CHUNK,
    TASK_INFER,
    client_app,
    problems_key,
)

log = logging.getLogger(__name__)


def _unavailable(e: BaseException, what: str) -> ServiceUnavailableError:
    return ServiceUnavailableError(
        f"{what}: the queue did not answer ({type(e).__name__}: {e}). "
        "Check that Redis and a worker are running, then retry."
    )


class CeleryExecutor(Executor):
    def __init__(self, settings: Settings | None = None):
        s = settings or get_settings()
        super().__init__(
            s,
            RedisJobStore(
                redis_client(s.service.queue_url, s.service.redis_timeout_s), s.service.redis_prefix
            ),
        )
        self.app = client_app(s)
        # image bytes
        self.raw = redis_client(s.service.queue_url, s.service.redis_timeout_s, decode_responses=False)

    def _send(self, name: str, args: list, queue: str, priority: int, **options: Any):
        from kombu.exceptions import OperationalError

        try:
            # argsrepr: Celery's generic saferepr of the arguments costs more than the rest of the message
            return self.app.send_task(
                name,
                args=args,
                queue=queue,
                priority=priority,
                argsrepr=repr(args),
                kwargsrepr="{}",
                **options,
            )
        except (OperationalError, ConnectionError, OSError) as e:
            raise _unavailable(e, "Could not queue the work") from e

    # -- interactive ---------------------------------------------------------------------------
    def infer(
        self,
        image: bytes,
        query: str,
        controls: Controls | None = None,
        timeout: float = 60.0,
        backend: str | None = None,
    ) -> RelevanceResult:
        import redis

        s = self.settings
        self._check_types(image, controls)
        image = bytes(image)
        check_image_header(image, s)
        text = validate_query(query, s.limits.max_query_chars)
        controls = controls or Controls()  # checked where the variant is known (the worker)
        s.engine.served_backend(backend)  # an unserved backend is a clear error, before anything is queued
        key = image_key(s, image)
        try:
            self.raw.set(key, image, ex=s.service.image_ttl_s)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise _unavailable(e, "Could not store the image") from e
        deadline = time.time() + timeout
        task_id = str(uuid.uuid4())
        reply_to = f"{s.service.redis_prefix}:reply:{task_id}"
        # the answer comes on our own reply list, not Celery's result backend: one blocking pop in
        # place of subscribe, get, unsubscribe and forget, and the arrays raw, not in base64
        self._send(
            TASK_INFER,
            [key, text, controls.to_wire(), deadline, backend, reply_to],
            s.service.queue_gpu,
            PRIORITY_INFER,
            expires=timeout,
            task_id=task_id,
            ignore_result=True,
        )
        frame = self._wait_reply(reply_to, deadline, timeout)
        return result_from_frame(frame)

    def _wait_reply(self, reply_to: str, deadline: float, timeout: float) -> bytes:
        import redis

        # each pop blocks for less than the socket timeout, so a dead Redis is still noticed
        step = max(0.1, self.settings.service.redis_timeout_s - 1.0)
        try:
            while (left := deadline - time.time()) > 0:
                popped = self.raw.blpop([reply_to], timeout=min(step, max(left, 0.01)))
                if popped is not None:
                    return popped[1]
        except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
            raise _unavailable(e, "Lost the result") from e
        problems = self.worker_problems()
        if problems:  # a worker runs but cannot serve: that, not "busy", is the reason
            raise ServiceUnavailableError(
                f"No worker answered within {timeout:.0f} s. " + " ".join(f"{p}." for p in problems)
            )
        raise ServiceUnavailableError(
            f"No worker answered within {timeout:.0f} s; the workers are busy or not running. Try again."
        )

    def worker_problems(self) -> list[str]:
        """What stops running workers serving, in words ("Worker arrcoc@host: its model ... could
        not load: ..."), as they report it (worker/state.py); empty when none does."""
        import redis

        s = self.settings
        try:
            keys = sorted(self.raw.scan_iter(problems_key(s.service.redis_prefix), count=1000))
            values = self.raw.mget(keys) if keys else []
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return []
        node_at = len(problems_key(s.service.redis_prefix, ""))
        return [
            f"Worker {key[node_at:].decode(errors='replace')}: {problem}"
            for key, value in zip(keys, values, strict=True)
            if value
            for problem in json.loads(value)
        ]

    # -- jobs --------------------------------------------------------------------------------
    def _start_batch(self, job_id, chunks, owner, pending):
        # the job's options are kept with the job (its record), so the chunk tasks' arguments stay as they were
        try:
            # a job's later chunks queue behind every job's first ones (Redis serves lower numbers
            # first): a small job submitted after a big one starts after the big one's first chunk
            for k, (start, stop) in enumerate(chunks):
                self._send(
                    TASK_CHUNK,
                    [job_id, start, stop],
                    self.settings.service.queue_gpu,
                    PRIORITY_CHUNK + min(k, 3),
                )
        except ServiceUnavailableError as e:
            self.store.set_state(job_id, JobState.FAILED, str(e))
            raise

    def submit_bench(self, request: BenchRequest, owner: str | None = None) -> str:
        job_id = bench.create_bench_job(request, self.settings, self.store, owner)
        self._send(TASK_BENCH, [job_id], self.settings.service.queue_bench, 0)
        return job_id

    def close(self) -> None:
        for closer in (self.raw.close, self.store.r.close, self.app.close):
            try:
                closer()
            except Exception:  # noqa: BLE001
                pass
