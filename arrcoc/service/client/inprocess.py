"""InProcessExecutor: no Redis. Threads in this process; batch jobs in the data dir.

Interactive requests go through the same dynamic batcher and `Runtime.run_batch` as a Celery
worker; batch and benchmark jobs run one at a time on a job thread through the same functions
(`arrcoc.service.jobs`). Job state lives in memory: it survives a browser refresh, not a restart.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from ...pipeline import RelevancePipeline
from ...request import Controls
from ...result import RelevanceResult
from ...settings import Settings, get_settings
from ..host.runtime import Runtime
from ..jobs import batch, bench
from ..jobs.files import Reaper
from ..jobs.store import MemoryJobStore
from ..jobs.types import BenchRequest, JobState
from .executor import Executor

log = logging.getLogger(__name__)


class InProcessExecutor(Executor):
    def __init__(self, settings: Settings | None = None, pipeline: RelevancePipeline | None = None):
        super().__init__(settings or get_settings(), MemoryJobStore())
        self.runtime = Runtime(self.settings, pipeline)
        self._jobs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="arrcoc-job")
        self.reaper = Reaper(self.settings).start()  # expired jobs' files go on time

    def warmup(self) -> None:
        """Build and warm the engine now instead of on the first request."""
        self.runtime.warm()

    def infer(self, image: bytes, query: str, controls: Controls | None = None, timeout: float = 60.0,
              backend: str | None = None) -> RelevanceResult:  # fmt: skip
        self._check_types(image, controls)
        return self.runtime.infer(bytes(image), query, controls or Controls(), timeout, backend)

    def submit_batch(self, archive: bytes, query: str | None = None, controls: Controls | None = None,
                     owner: str | None = None) -> str:  # fmt: skip
        self._check_types(archive, controls)
        job_id, chunks = batch.create_batch_job(bytes(archive), query, controls, self.settings, self.store, owner)
        self._jobs.submit(self._run_batch, job_id, chunks)
        return job_id

    def _run_batch(self, job_id: str, chunks: list[tuple[int, int]]) -> None:
        try:
            # the whole job as one chunk: chunks are Celery's unit of redelivery, which a job
            # thread does not have, and each chunk's pipeline fills and drains anew
            if chunks:
                batch.run_chunk(job_id, chunks[0][0], chunks[-1][1], self.runtime, self.store, self.settings)
            batch.maybe_finalize(job_id, self.store, self.settings)
        except Exception as e:  # never leave a job "running" when its thread died
            log.exception("batch job %s failed", job_id)
            self.store.set_state(job_id, JobState.FAILED, f"The job failed: {type(e).__name__}: {e}",
                                 expect=(JobState.PENDING, JobState.RUNNING))  # fmt: skip

    def submit_bench(self, request: BenchRequest, owner: str | None = None) -> str:
        job_id = bench.create_bench_job(request, self.settings, self.store, owner)
        self._jobs.submit(bench.run_bench_job, job_id, self.runtime, self.store, self.settings)
        return job_id

    def close(self) -> None:
        self.reaper.stop()
        self._jobs.shutdown(wait=False, cancel_futures=True)
        self.runtime.close()
