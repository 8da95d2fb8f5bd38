"""The Executor interface: what the demo and the CLI ask of the serving side.

Two implementations run the same arrcoc code paths: InProcessExecutor (no Redis: the embedded
default, Hugging Face Spaces, tests) and CeleryExecutor (Redis + GPU workers). `create_executor`
picks one from the settings (ARRCOC_BROKER_URL set -> Celery).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from ..errors import ArrcocError
from ..pipeline import Controls
from ..result import RelevanceResult


class ServiceUnavailableError(ArrcocError):
    """The queue (Redis) or its workers did not answer in time: check that they run, then retry."""


class JobState(str, Enum):  # noqa: UP042 -- str() of a member stays as it was
    PENDING = "pending"  # accepted, waiting for a worker
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # with a reason in JobStatus.message
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # its TTL passed; results are gone

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED, JobState.EXPIRED)


class JobKind(str, Enum):  # noqa: UP042
    BATCH = "batch"
    BENCH = "bench"


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    kind: JobKind
    state: JobState
    total: int = 0
    done: int = 0
    failed: int = 0
    message: str = ""  # the reason when failed; a note otherwise
    queue_position: int | None = None  # jobs ahead of this one, when known
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def progress(self) -> float:
        return (self.done + self.failed) / self.total if self.total else 0.0


@dataclass(frozen=True)
class BenchRequest:
    variants: tuple[str, ...] = ("arrcoc-texture",)
    backends: tuple[str, ...] = ("eager", "compiled", "onnx")
    buckets: tuple[int, ...] = (1, 8, 64)
    iterations: int = 100
    warmup: int = 10
    device: str = "auto"
    options: dict[str, Any] = field(default_factory=dict)


class Executor(ABC):
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

    @abstractmethod
    def status(self, job_id: str) -> JobStatus: ...

    @abstractmethod
    def cancel(self, job_id: str) -> JobStatus: ...

    @abstractmethod
    def batch_results(self, job_id: str) -> Path:
        """Path of the results zip (overlay PNGs, results.jsonl, summary.csv) of a batch job."""

    @abstractmethod
    def bench_report(self, job_id: str) -> dict[str, Any]:
        """The benchmark report (JSON document) of a finished bench job."""

    def close(self) -> None:  # noqa: B027 -- optional hook
        """Release connections and threads."""


def create_executor(settings=None) -> Executor:
    """Celery when a broker is configured, otherwise in-process."""
    from ..settings import get_settings

    settings = settings or get_settings()
    if settings.broker_url:
        from .celery_executor import CeleryExecutor

        return CeleryExecutor(settings)
    from .inprocess import InProcessExecutor

    return InProcessExecutor(settings)
