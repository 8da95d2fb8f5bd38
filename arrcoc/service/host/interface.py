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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...settings import DEFAULT_OVERLAY_KIND

if TYPE_CHECKING:  # the types only: importing this module loads no engine
    from ...images import ImageLike
    from ...request import Controls
    from ...result import RelevanceResult
    from ...settings import Settings
    from ..jobs.types import BenchRequest

Progress = Callable[[float, str], None]


# StepOutputs' (n, G, G) maps, in results.parquet's column order
MAPS = ("relevance", "information", "perspectival", "participatory", "budget_map")


@dataclass(frozen=True)
class StepOutputs:
    """A batch-job step's results as arrays over its items, row i item i (a failed item's row is
    zeros, `ok` False): what results.parquet's row group is written from, column by column.
    Picklable: it crosses to a worker group's Celery processes."""

    ok: np.ndarray  # (n,) bool
    relevance: np.ndarray  # (n, G, G) float32, and the three scorer maps
    information: np.ndarray
    perspectival: np.ndarray
    participatory: np.ndarray
    budget_map: np.ndarray  # (n, G, G) float32 tokens per cell, 0 where not selected
    selected: np.ndarray  # (n, K) int32 cells, most relevant first
    budgets: np.ndarray  # (n, K) int32 tokens per selected cell
    balance: np.ndarray  # (n, 3) float32, arrcoc.result.SCORER_NAMES order
    tensions: np.ndarray  # (n, 3) float32, arrcoc.result.TENSION_NAMES order
    match_score: np.ndarray  # (n,) float32
    image_size: np.ndarray  # (n, 2) int32 (width, height) of the upright original
    bucket: np.ndarray  # (n,) int32 the engine bucket that ran the item
    token_budget: int
    variant: str = ""
    weights_version: str = ""
    backend: str = ""

    def __len__(self) -> int:
        return int(self.ok.shape[0])

    @classmethod
    def concat(cls, parts: Sequence[StepOutputs]) -> StepOutputs:
        """Steps' outputs one after another (a step run item by item); a part that ran nothing
        takes the shapes of those that ran."""
        ran = [p for p in parts if p.ok.any()]
        like = ran[0] if ran else parts[0]
        grid, k = like.relevance.shape[-1], like.selected.shape[1]
        same = [
            p if (p.relevance.shape[-1], p.selected.shape[1]) == (grid, k) else cls.failed(len(p), grid, k)
            for p in parts
        ]
        arrays = {f: np.concatenate([getattr(p, f) for p in same]) for f in _ARRAY_FIELDS}
        return cls(
            **arrays,
            token_budget=like.token_budget,
            variant=like.variant,
            weights_version=like.weights_version,
            backend=like.backend,
        )

    @classmethod
    def failed(cls, n: int, grid: int = 1, k: int = 1) -> StepOutputs:
        """n items none of which ran."""
        maps = np.zeros((n, grid, grid), np.float32)
        pair = np.zeros((n, 3), np.float32)
        return cls(
            np.zeros(n, bool),
            maps,
            maps,
            maps,
            maps,
            maps,
            np.zeros((n, k), np.int32),
            np.zeros((n, k), np.int32),
            pair,
            pair,
            np.zeros(n, np.float32),
            np.zeros((n, 2), np.int32),
            np.zeros(n, np.int32),
            0,
        )


_ARRAY_FIELDS = (
    "ok",
    *MAPS,
    "selected",
    "budgets",
    "balance",
    "tensions",
    "match_score",
    "image_size",
    "bucket",
)


@dataclass(frozen=True)
class ProcessedBatch:
    """A batch job's step as the engine host hands it back: its results as columns, and per item
    its error message (None when it ran) and its encoded overlay (None without one)."""

    outputs: StepOutputs
    errors: list[str | None]
    overlays: list[bytes | None]
    # where the step's time went, in ms (decode, engine, render_encode): the end-to-end breakdown
    stage_ms: dict[str, float] = field(default_factory=dict)

    def result(self, i: int) -> RelevanceResult | None:
        """Item i as a RelevanceResult (no texture, no timings): for callers that want one item."""
        from ...result import RelevanceResult

        o = self.outputs
        if not o.ok[i]:
            return None
        return RelevanceResult(
            variant=o.variant,
            weights_version=o.weights_version,
            backend=o.backend,
            query="",
            relevance=o.relevance[i],
            information=o.information[i],
            perspectival=o.perspectival[i],
            participatory=o.participatory[i],
            balance=o.balance[i],
            tensions=o.tensions[i],
            selected=o.selected[i].astype(np.int64),
            budgets=o.budgets[i].astype(np.int64),
            budget_map=o.budget_map[i],
            texture=np.empty(0, np.float32),
            image_size=(int(o.image_size[i, 0]), int(o.image_size[i, 1])),
            token_budget=o.token_budget,
            bucket=int(o.bucket[i]),
            match_score=float(o.match_score[i]),
        )


def step_threads(settings: Settings) -> ThreadPoolExecutor:
    """An engine host's batch pipeline step threads (batching.steps_in_flight; each starts on first
    use), shared by every chunk the host runs, whoever sent it: each carries a step from its files
    to its recorded results, so one step is written while the next is decoded and run."""
    return ThreadPoolExecutor(settings.batching.steps_in_flight, thread_name_prefix="arrcoc-step")


class EngineHost(ABC):
    settings: Settings
    step_pool: ThreadPoolExecutor  # step_threads(settings), made with the host

    @abstractmethod
    def warm(self) -> None:
        """Build and warm the default backend's engine now, not on the first request."""

    @property
    @abstractmethod
    def max_batch(self) -> int:
        """The largest batch one engine call takes."""

    @property
    @abstractmethod
    def on_cpu(self) -> bool:
        """Whether the engine computes on this machine's CPU cores (no accelerator)."""

    @abstractmethod
    def infer(
        self, image: ImageLike, query: str, controls: Controls, timeout: float, backend: str | None = None
    ) -> RelevanceResult:
        """One interactive request through the dynamic batcher; waits at most `timeout` s."""

    @abstractmethod
    def process(
        self,
        images: Sequence[bytes],
        queries: Sequence[str],
        controls: Controls,
        overlay: str,
        backend: str | None = None,
        kind: str = DEFAULT_OVERLAY_KIND,
    ) -> ProcessedBatch:
        """A batch job's step, bytes to results: decoded together on the engine's path, run in as
        few engine calls as the buckets allow, overlays drawn and encoded together (`overlay`:
        jpeg, png or none; `kind`: what they show, arrcoc.settings.OVERLAY_KINDS). Results as
        columns over the items, in order; a bad item fails alone."""

    @abstractmethod
    def benchmark(
        self, request: BenchRequest, progress: Progress | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The benchmark harness's report, with the device held throughout, and what waited."""

    @abstractmethod
    def close(self) -> None:
        """Release the engine (or the connection to it)."""
