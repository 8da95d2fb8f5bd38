"""EngineHost: what the serving code asks of whoever owns the device.

Two implementations: `Runtime` (the engine in this process: the in-process executor and a
one-process Celery worker) and `EngineClient` (the engine in the worker group's engine process,
reached over a local socket). Jobs, tasks and executors are typed against this class only, so
"in this process or another" is decided once, where the host is made (worker/state.py,
client/inprocess.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the types only: importing this module loads no engine
    from ...images import ImageLike
    from ...request import Controls
    from ...result import RelevanceResult
    from ..jobs.types import BenchRequest

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Processed:
    """One batch-job item as the engine host hands it back (picklable: it crosses to a group's
    Celery processes)."""

    result: RelevanceResult | None = None
    error: dict[str, str] | None = None  # the item's error in the wire form (arrcoc.service.codec)
    overlay: bytes | None = None  # the encoded overlay (ProcessedBatch.overlay_format), if any


@dataclass(frozen=True)
class ProcessedBatch:
    items: list[Processed]
    # where the batch's time went, in ms (decode, engine, render_encode): the end-to-end breakdown
    stage_ms: dict[str, float] = field(default_factory=dict)


class EngineHost(ABC):
    @abstractmethod
    def warm(self) -> None:
        """Build and warm the default backend's engine now, not on the first request."""

    @property
    @abstractmethod
    def max_batch(self) -> int:
        """The largest batch one engine call takes."""

    @property
    @abstractmethod
    def in_this_process(self) -> bool:
        """Whether the engine's decoding and running share this process (and its GIL) with the
        caller (a batch job then keeps one engine call in flight, and on a GPU writes its parts in
        a child process: arrcoc.service.jobs.batch)."""

    @property
    @abstractmethod
    def on_cpu(self) -> bool:
        """Whether the engine computes on this machine's CPU cores (no accelerator): it keeps every
        core busy itself, so a batch job starts no extra process beside it."""

    @abstractmethod
    def infer(self, image: ImageLike, query: str, controls: Controls, timeout: float,
              backend: str | None = None) -> RelevanceResult:  # fmt: skip
        """One interactive request through the dynamic batcher; waits at most `timeout` s."""

    @abstractmethod
    def process(self, images: Sequence[bytes], queries: Sequence[str], controls: Controls, overlay: str,
                backend: str | None = None) -> ProcessedBatch:  # fmt: skip
        """A batch job's items, bytes to results: decoded together on the engine's path, run in as
        few engine calls as the buckets allow, overlays rendered and encoded (`overlay`: jpeg,
        png or none). One Processed per item, in order; a bad item fails alone."""

    @abstractmethod
    def benchmark(self, request: BenchRequest, progress: Progress | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The benchmark harness's report, with the device held throughout, and what waited."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine (or the connection to it)."""
