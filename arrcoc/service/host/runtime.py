"""One engine per process: the engine, the device lock, and per backend the host's one pipeline
(gather: the dynamic batcher -> decode -> engine -> outputs: arrcoc.service.host.stages).

Both executors run work through a Runtime, so a result is the same whichever one served it.
Nothing here touches the device until first use (`pipeline` is built lazily), so a Celery
prefork parent can import this module and fork safely.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ... import overlays
from ...engine import create_backend, resolve_device
from ...engine.base import serving_dtype
from ...errors import ArrcocError, DeadlineExceeded
from ...images import ImageLike
from ...pipeline import PreparedRequest, RelevancePipeline
from ...request import Controls, check_overlay_kind, image_limits
from ...result import RelevanceResult
from ...settings import DEFAULT_OVERLAY_KIND, Settings
from ...tuning import CPU_MAX_BATCH
from ..codec import error_to_wire
from ..jobs.types import BenchRequest
from .batching import DynamicBatcher
from .interface import EngineHost, ProcessedBatch, Progress, step_threads
from .stages import Stages, on_stream

log = logging.getLogger(__name__)


class Runtime(EngineHost):
    def __init__(self, settings: Settings, pipeline: RelevancePipeline | None = None):
        self.settings = settings
        # one pipeline and one batcher per backend served; they share the model and the encoder
        self._pipelines: dict[str, RelevancePipeline] = {}
        if pipeline is not None:  # lent by the caller, who closes it (it may serve other runtimes)
            self._pipelines[pipeline.backend.name] = pipeline
        self._lent = pipeline
        self._build_lock = threading.RLock()
        self._stages: dict[str, Stages] = {}  # each backend's decode, engine and outputs stages
        self._batchers: dict[str, DynamicBatcher] = {}  # each backend's gather stage
        # held while an engine call starts; a benchmark holds it throughout
        self.device_lock = threading.RLock()
        self._streams = threading.local()  # a CUDA stream per thread (_thread_stream)
        self.step_pool = step_threads(settings)

    # -- the engine ------------------------------------------------------------------------
    @property
    def pipeline(self) -> RelevancePipeline:
        """The pipeline of the default backend (ARRCOC_ENGINE__BACKEND)."""
        return self.pipeline_for(None)

    def pipeline_for(self, backend: str | None) -> RelevancePipeline:
        name = self.settings.engine.served_backend(backend)
        pipe = self._pipelines.get(name)
        if pipe is None:
            with self._build_lock:
                pipe = self._pipelines.get(name)
                if pipe is None:
                    pipe = self._pipelines[name] = self._build(name)
        return pipe

    def _build(self, backend: str) -> RelevancePipeline:
        s = self.settings
        t0 = time.perf_counter()
        buckets = self.buckets
        first = next(iter(self._pipelines.values()), None)
        if first is None:
            pipe = RelevancePipeline(
                s.engine.variant,
                s.engine.weights or "default",
                backend,
                s.engine.device,
                limits=image_limits(s),
                buckets=buckets,
                cache_dir=s.service.cache_dir,
                dtype=s.engine.dtype,
                query_source=s.engine.query_encoder,
                query_cache_size=s.engine.query_cache_size,
                max_query_chars=s.limits.max_query_chars,
            )
        else:  # another backend over the same model and query encoder
            dtype = serving_dtype(s.engine.dtype, first.device, first.variant.gpu_dtype, backend)
            engine = create_backend(backend, first.model, first.device, buckets, dtype, s.service.cache_dir)
            pipe = RelevancePipeline(
                s.engine.variant,
                backend=engine,
                device=str(first.device),
                query_encoder=first.encoder,
                limits=image_limits(s),
            )
        pipe.warmup()
        pipe.encoder.encode("warm up")  # load the query encoder now, not on the first request
        log.info(
            "engine %s/%s on %s ready in %.1f s",
            s.engine.variant,
            pipe.backend.name,
            pipe.device,
            time.perf_counter() - t0,
        )
        return pipe

    @property
    def buckets(self) -> tuple[int, ...]:
        """The engine's buckets. On a CPU, unless ARRCOC_ENGINE__BUCKETS is set, only those up to the CPU
        batch cap: larger ones are never used there, and each costs a compile on `compiled`."""
        s = self.settings
        if "buckets" in s.engine.model_fields_set or resolve_device(s.engine.device).type != "cpu":
            return s.engine.buckets
        return tuple(b for b in s.engine.buckets if b <= self._cpu_batch_cap) or s.engine.buckets[:1]

    @property
    def _cpu_batch_cap(self) -> int:
        s = self.settings
        return s.batching.max_size if "max_size" in s.batching.model_fields_set else CPU_MAX_BATCH

    @property
    def max_batch(self) -> int:
        """Largest batch one engine call runs (a batch job's step is two): the largest bucket."""
        return max(self.buckets)

    @property
    def interactive_batch(self) -> int:
        """Largest batch the dynamic batcher gathers: ARRCOC_BATCHING__MAX_SIZE (32 by default) on a
        GPU, 1 on a CPU unless it is set (see CPU_MAX_BATCH); never over the largest bucket."""
        size = self.settings.batching.max_size
        if self.pipeline.device.type == "cpu":
            size = min(size, self._cpu_batch_cap)
        return max(1, min(size, max(self.buckets)))

    @property
    def on_cpu(self) -> bool:
        return self.pipeline.device.type == "cpu"

    def prepare(self, image: ImageLike, query: str, controls: Controls) -> PreparedRequest:
        """Check and resize one request in the caller's thread (see RelevancePipeline.prepare)."""
        return self.pipeline.prepare(image, query, controls)

    def stages_for(self, backend: str | None) -> Stages:
        """The backend's decode, engine and outputs stages (arrcoc.service.host.stages)."""
        name = self.settings.engine.served_backend(backend)
        stages = self._stages.get(name)
        if stages is None:
            pipe = self.pipeline_for(name)  # build and warm the engine first
            with self._build_lock:
                stages = self._stages.get(name)
                if stages is None:
                    stages = self._stages[name] = Stages(pipe, self.device_lock, self._thread_stream)
        return stages

    def run_batch(
        self, items: Sequence[PreparedRequest], backend: str | None = None
    ) -> list[RelevanceResult | Exception]:
        """Prepared requests -> one result or one error per item (the engine and outputs stages)."""
        results = self.stages_for(backend).engine(list(items))()
        return [r if isinstance(r, Exception) else r() for r in results]

    # -- batch jobs: bytes to results and overlays, on the engine's device ---------------------
    def process(
        self,
        images: Sequence[bytes],
        queries: Sequence[str],
        controls: Controls,
        overlay: str,
        backend: str | None = None,
        kind: str = DEFAULT_OVERLAY_KIND,
    ) -> ProcessedBatch:
        stages = self.stages_for(backend)
        # on a GPU each calling thread works on a stream of its own, so that calls in flight
        # together (a batch job's pipeline, a worker group's processes) overlap: one's overlays
        # encode while the next decodes; the stage times are this stream's, waited for
        stream = self._thread_stream(stages.pipe.device)
        with on_stream(stream) if stream is not None else contextlib.nullcontext():
            return self._process(
                stages,
                images,
                queries,
                controls,
                overlay,
                check_overlay_kind(kind),
                backend,
                stream.synchronize if stream is not None else (lambda: None),
            )

    def _process(
        self,
        stages: Stages,
        images: Sequence[bytes],
        queries: Sequence[str],
        controls: Controls,
        overlay: str,
        kind: str,
        backend: str | None,
        sync,
    ) -> ProcessedBatch:
        """A step entering the pipeline at decode: decode -> engine -> outputs (overlays when asked)."""
        t0 = time.perf_counter()
        prepared = stages.pipe.prepare_many(
            images, queries, controls, None if overlay == "none" else self.settings.jobs.overlay_max_side
        )
        sync()  # the stage times below are the device's too
        t1 = time.perf_counter()
        errors = [error_to_wire(p)["message"] if isinstance(p, ArrcocError) else None for p in prepared]
        outputs = stages.run_step([None if isinstance(p, ArrcocError) else p[0] for p in prepared], errors)
        t2 = time.perf_counter()
        pictures: list[bytes | None] = [None] * len(prepared)
        done = np.flatnonzero(outputs.ok)
        if overlay != "none" and len(done):
            maps = outputs.budget_map if kind == "foveated" else outputs.relevance
            encoded = overlays.encode(
                [prepared[i][1] for i in done],
                maps[done],
                overlay,
                self.settings.jobs.overlay_jpeg_quality,
                kind,
            )
            for i, data in zip(done, encoded, strict=True):
                pictures[i] = data
        t3 = time.perf_counter()
        stage_ms = {"decode": (t1 - t0) * 1e3, "engine": (t2 - t1) * 1e3, "render_encode": (t3 - t2) * 1e3}
        return ProcessedBatch(outputs, errors, pictures, stage_ms)

    # -- interactive requests: through the batcher -----------------------------------------
    def batcher_for(self, backend: str | None) -> DynamicBatcher:
        name = self.settings.engine.served_backend(backend)
        batcher = self._batchers.get(name)
        if batcher is None:
            self.pipeline_for(name)  # build and warm the engine first
            size = self.interactive_batch
            with self._build_lock:
                batcher = self._batchers.get(name)
                if batcher is None:
                    # each request's result is built by its caller (infer_prepared), not by the batcher
                    batcher = self._batchers[name] = DynamicBatcher(
                        self.stages_for(name),
                        size,
                        self.settings.batching.max_delay_ms / 1e3,
                        f"arrcoc-batcher-{name}",
                        self.settings.batching.idle_wait,
                    )
        return batcher

    @property
    def submitted(self) -> int:
        return sum(b.submitted for b in self._batchers.values())

    def infer(
        self, image: ImageLike, query: str, controls: Controls, timeout: float, backend: str | None = None
    ) -> RelevanceResult:
        self.settings.engine.served_backend(backend)  # an unserved backend is a clear error, before any work
        return self.infer_prepared(self.prepare(image, query, controls), timeout, backend)

    def infer_prepared(
        self, request: PreparedRequest, timeout: float, backend: str | None = None
    ) -> RelevanceResult:
        """One prepared request through the batcher: waits at most `timeout` seconds."""
        batcher = self.batcher_for(backend)
        fut = batcher.submit(self._staged(request, backend), time.monotonic() + timeout)
        try:
            built = fut.result(timeout=timeout)
        except TimeoutError:
            fut.cancel()
            raise DeadlineExceeded(
                f"No result within {timeout:.0f} s; the engine is busy. Try again."
            ) from None
        return built()  # this request's result, built here rather than on the batcher's thread

    def _staged(self, request: PreparedRequest, backend: str | None) -> PreparedRequest:
        """On a GPU, copy the pixels to the device as the request arrives (in the caller's thread),
        so the batch thread stacks them there instead of copying 0.8 MB per image while the batch
        waits."""
        if (
            request.pixels is None
            or request.pixels.is_cuda
            or self.pipeline_for(backend).device.type != "cuda"
        ):
            return request
        return dataclasses.replace(request, pixels=self.copy_to_device(request.pixels, backend))

    def copy_to_device(self, pixels: torch.Tensor, backend: str | None = None) -> torch.Tensor:
        """A private copy of `pixels` (which the caller may overwrite once this returns) on the
        engine's device. On a GPU the copy runs on this thread's own stream and is waited for
        there, so it never queues behind a running batch on the default stream. The copy outlives
        its use: the batch that stacks it has synchronised (outputs to the host) before the
        request, and with it this tensor, is released."""
        device = self.pipeline_for(backend).device
        if device.type != "cuda":
            return pixels.clone()
        stream = self._thread_stream(device)
        with on_stream(stream):
            out = pixels.to(device, non_blocking=True)
        stream.synchronize()
        return out

    def _thread_stream(self, device: torch.device) -> torch.cuda.Stream | None:
        """This thread's own CUDA stream on `device` (None off the GPU)."""
        if device.type != "cuda":
            return None
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = torch.cuda.Stream(device)
        return stream

    def _gpu_in_use(self) -> torch.device | None:
        """This process's GPU once CUDA is up in it; None otherwise (nothing there to wait for)."""
        device = resolve_device(self.settings.engine.device)
        return device if device.type == "cuda" and torch.cuda.is_initialized() else None

    def device_lost(self) -> str | None:
        """Why this process's GPU can run nothing more, or None. A CUDA error that sticks to the
        process's context (a device-side assert, an illegal memory access) fails every later call,
        so it shows in a synchronize; other errors (out of memory, a bad argument) do not."""
        device = self._gpu_in_use()
        if device is None:
            return None
        try:
            torch.cuda.synchronize(device)
        except RuntimeError as e:
            return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None

    def warm(self) -> None:
        """Build and warm the default backend's engine and batcher now, not on the first request."""
        self.batcher_for(None)

    # -- benchmarks: the device held exclusively -------------------------------------------
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[dict[str, Any]]:
        """Hold the device: interactive batches and batch chunks wait until the block ends."""
        t0 = time.perf_counter()
        before = self.submitted
        with self.device_lock:
            if (device := self._gpu_in_use()) is not None:
                torch.cuda.synchronize(device)  # the engine calls started before it, finished
            note: dict[str, Any] = {"waited_for_device_ms": round((time.perf_counter() - t0) * 1e3, 1)}
            t1 = time.perf_counter()
            try:
                yield note
            finally:
                note["held_ms"] = round((time.perf_counter() - t1) * 1e3, 1)
                after = self.submitted
                note["interactive_requests_waited"] = after - before

    def benchmark(
        self, request: BenchRequest, progress: Progress | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The harness's report with the device held throughout, and what waited meanwhile."""
        from .benchmark import run_benchmark

        with self.exclusive() as note:
            if progress:
                progress(0.0, "starting: loading the benchmark harness")
            report = run_benchmark(request, self.settings, progress)
        return report, note

    def close(self) -> None:
        self.step_pool.shutdown(wait=False, cancel_futures=True)
        for batcher in self._batchers.values():
            batcher.close()
        for pipe in self._pipelines.values():
            if pipe is not self._lent:
                pipe.backend.close()
