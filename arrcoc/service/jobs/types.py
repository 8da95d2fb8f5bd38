"""The job model's types: what a job is, its states, and what a benchmark job asks for.

Plain data, no I/O: the stores, the executors, the engine host and the worker all speak these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ...settings import BACKENDS


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
    backends: tuple[str, ...] = BACKENDS
    buckets: tuple[int, ...] = (1, 8, 64)
    iterations: int = 100
    warmup: int = 10
    device: str = "auto"
    options: dict[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "variants": list(self.variants),
            "backends": list(self.backends),
            "buckets": list(self.buckets),
            "iterations": self.iterations,
            "warmup": self.warmup,
            "device": self.device,
            "options": dict(self.options),
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> BenchRequest:
        return cls(
            tuple(d["variants"]),
            tuple(d["backends"]),
            tuple(int(b) for b in d["buckets"]),
            int(d["iterations"]),
            int(d["warmup"]),
            d.get("device", "auto"),
            d.get("options", {}),
        )
