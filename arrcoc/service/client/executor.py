"""The Executor interface: what the demo and the CLI ask of the serving side.

Two implementations run the same arrcoc code paths: InProcessExecutor (no Redis: the embedded
default, Hugging Face Spaces, tests) and CeleryExecutor (Redis + GPU workers); factory.py picks
one from the settings (ARRCOC_SERVICE__BROKER_URL set -> Celery). Job status, cancel and results
come from the job store the same way for both, so they are implemented here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInputError
from ...request import Controls
from ...settings import Settings
from ..jobs import batch, bench
from ..jobs.files import job_dir
from ..jobs.store import JobStore
from ..jobs.types import BenchRequest, JobStatus

if TYPE_CHECKING:
    from ...result import RelevanceResult
    from ..jobs.archive import PendingArchive


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

        backend: one of the served backends (ARRCOC_ENGINE__BACKENDS); None means ARRCOC_ENGINE__BACKEND.
        """

    def submit_batch(
        self,
        archive: bytes,
        query: str | None = None,
        controls: Controls | None = None,
        owner: str | None = None,
        overlays: str | None = None,
        paid_by: str | None = None,
    ) -> str:
        """A zip of images (one query for all) or a zip with manifest.csv/.jsonl (file,query).

        owner: who may see the job afterwards (arrcoc.service.access; None: anyone with the id).
        overlays: the pictures the job draws beside its rows, one of arrcoc.settings.OVERLAYS ("none",
        the default: results.parquet and summary.csv only; "relevance": the map over each photo;
        "foveated": the photo under the result's token budgets).
        paid_by: whose share of the disk budget the job counts against (arrcoc.service.jobs.budget.payer;
        None: the owner's).
        """
        self._check_types(archive, controls)
        job_id, chunks, pending = batch.create_batch_job(
            bytes(archive),
            query,
            controls,
            self.settings,
            self.store,
            owner,
            overlays,
            paid_by,
            defer_archive=self.starts_jobs_unwritten,
        )
        self._start_batch(job_id, chunks, owner, pending)
        return job_id

    # whether a job may run from its zip in memory, never writing it unless it waits for a turn
    # (batch.create_batch_job's `defer_archive`): where one thread runs the job, not processes that
    # take its chunks from a queue and read its files
    starts_jobs_unwritten = False

    @abstractmethod
    def _start_batch(
        self, job_id: str, chunks: list[tuple[int, int]], owner: str | None, pending: PendingArchive | None
    ) -> None:
        """Hand a recorded job's chunks [start, stop) to whoever runs them; `pending`: its zip,
        still in memory (only where `starts_jobs_unwritten`)."""

    @abstractmethod
    def submit_bench(self, request: BenchRequest, owner: str | None = None) -> str:
        """Run the benchmark harness with the device held exclusively; returns a job id."""

    def _job(self, job_id: object, owner: str | None) -> str:
        if not isinstance(job_id, str):
            raise InvalidInputError(f"A job id is text, got {type(job_id).__name__}.")
        job_dir(self.settings, job_id)  # checks the id's form
        self.store.check_owner(job_id, owner)
        return job_id

    def status(self, job_id: str, owner: str | None = None) -> JobStatus:
        return self.store.status(self._job(job_id, owner))

    def cancel(self, job_id: str, owner: str | None = None) -> JobStatus:
        self.store.cancel(self._job(job_id, owner))
        return self.store.status(job_id)

    def batch_results(self, job_id: str, owner: str | None = None) -> Path:
        """Path of the results zip (overlays, results.parquet, summary.csv) of a batch job."""
        return batch.results_zip(self._job(job_id, owner), self.store, self.settings)

    def bench_report(self, job_id: str, owner: str | None = None) -> dict[str, Any]:
        """The benchmark report (JSON document) of a finished bench job."""
        return bench.bench_report(self._job(job_id, owner), self.store, self.settings)

    @staticmethod
    def _check_types(image: object, controls: object) -> None:
        """Strict types at the boundary: encoded image bytes and a Controls (or None)."""
        if not isinstance(image, bytes | bytearray | memoryview):
            raise InvalidInputError(
                f"The image must be encoded bytes (a PNG, JPEG, ... file), got {type(image).__name__}."
            )
        if controls is not None and not isinstance(controls, Controls):
            raise InvalidInputError(f"The controls must be a Controls, got {type(controls).__name__}.")

    def worker_problems(self) -> list[str]:
        """What stops the workers behind this executor serving, in words; none in process (a
        request there raises its own reason)."""
        return []

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release connections and threads."""
