"""The Executor interface: what the demo and the CLI ask of the serving side.

Two implementations run the same arrcoc code paths: InProcessExecutor (no Redis: the embedded
default, Hugging Face Spaces, tests) and CeleryExecutor (Redis + GPU workers); factory.py picks
one from the settings (ARRCOC_BROKER_URL set -> Celery). Job status, cancel and results
come from the job store the same way for both, so they are implemented here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...request import Controls
from ...settings import Settings
from ..jobs import batch, bench
from ..jobs.files import job_dir
from ..jobs.store import JobStore
from ..jobs.types import BenchRequest, JobStatus

if TYPE_CHECKING:
    from ...result import RelevanceResult


class Executor(ABC):
    def __init__(self, settings: Settings, store: JobStore):
        self.settings = settings
        self.store = store

    @abstractmethod
    def infer(
        self,
        image: bytes,
        query: str,
        controls: Controls | None = None,
        timeout: float = 60.0,
        backend: str | None = None,
    ) -> RelevanceResult:
        """One image (encoded bytes) + one query -> result. Raises arrcoc errors on bad input.

        backend: one of the served backends (ARRCOC_BACKENDS); None means ARRCOC_BACKEND.
        """

    @abstractmethod
    def submit_batch(
        self, archive: bytes, query: str | None = None, controls: Controls | None = None
    ) -> str:
        """A zip of images (one query for all) or a zip with manifest.csv/.jsonl (file,query)."""

    @abstractmethod
    def submit_bench(self, request: BenchRequest) -> str:
        """Run the benchmark harness with the device held exclusively; returns a job id."""

    def status(self, job_id: str) -> JobStatus:
        job_dir(self.settings, job_id)  # checks the id's form
        return self.store.status(job_id)

    def cancel(self, job_id: str) -> JobStatus:
        self.store.cancel(job_id)
        return self.store.status(job_id)

    def batch_results(self, job_id: str) -> Path:
        """Path of the results zip (overlay PNGs, results.jsonl, summary.csv) of a batch job."""
        return batch.results_zip(job_id, self.store, self.settings)

    def bench_report(self, job_id: str) -> dict[str, Any]:
        """The benchmark report (JSON document) of a finished bench job."""
        return bench.bench_report(job_id, self.store, self.settings)

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release connections and threads."""
