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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the types only: importing this module loads no engine
    from ...images import ImageLike
    from ...pipeline import PreparedRequest
    from ...request import Controls
    from ...result import RelevanceResult
    from ..jobs.types import BenchRequest

Progress = Callable[[float, str], None]


class EngineHost(ABC):
    @abstractmethod
    def warm(self) -> None:
        """Build and warm the default backend's engine now, not on the first request."""

    @property
    @abstractmethod
    def max_batch(self) -> int:
        """The largest batch one engine call takes."""

    @abstractmethod
    def prepare(self, image: ImageLike, query: str, controls: Controls) -> PreparedRequest:
        """Check, decode and resize one request in the caller's thread (no engine needed)."""

    @abstractmethod
    def infer(self, image: ImageLike, query: str, controls: Controls, timeout: float,
              backend: str | None = None) -> RelevanceResult:  # fmt: skip
        """One interactive request through the dynamic batcher; waits at most `timeout` s."""

    @abstractmethod
    def run_batch(self, items: Sequence[PreparedRequest],
                  backend: str | None = None) -> list[RelevanceResult | Exception]:  # fmt: skip
        """Prepared requests -> one result or one error per item (a batch job's chunk)."""

    @abstractmethod
    def benchmark(self, request: BenchRequest, progress: Progress | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The benchmark harness's report, with the device held throughout, and what waited."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine (or the connection to it)."""
