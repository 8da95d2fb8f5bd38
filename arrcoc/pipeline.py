"""The library's front door: images + queries -> RelevanceResult, on any backend.

    pipe = RelevancePipeline("arrcoc-texture", backend="eager")
    [result] = pipe.infer(["arrcoc/examples/coffee.jpg"], "the red one")

Executors (in-process and Celery) and the CLI all call this, so every path gives the same result.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .encoders import TextEncoder
from .engine import Backend, create_backend, resolve_device
from .engine.base import serving_dtype
from .errors import ArrcocError, InvalidInputError
from .images import ImageLike, ImageLimits, load_decoded, read_bytes
from .model import ModelOutput
from .preprocess import Decoder, Encoded, to_tensor
from .query import query_encoder_for
from .registry import create_model, get_variant
from .request import MAX_QUERY_CHARS, Controls, validate_query
from .result import RelevanceResult
from .settings import DEFAULT_BUCKETS


@dataclass(frozen=True)
class PreparedRequest:
    """One request checked and resized, ready to join a batch (see RelevancePipeline.prepare)."""

    pixels: torch.Tensor | None  # uint8 (3, S, S); None until the batch decodes `encoded` (GPU)
    size: tuple[int, int]  # the original (width, height): heatmaps are drawn back at this size
    query: str  # validated, whitespace normalised
    controls: Controls  # validated, defaults filled in
    prepare_ms: float
    encoded: Encoded | None = None  # a checked JPEG the GPU decodes with its batch
    batch_decode_ms: float | None = None  # the wall time of its batch's decode stage (GPU), once decoded


class RelevancePipeline:
    def __init__(
        self,
        variant: str = "arrcoc-texture",
        weights: str | Path | None = "default",
        backend: str | Backend = "eager",
        device: str = "auto",
        query_encoder: TextEncoder | None = None,
        limits: ImageLimits = ImageLimits(),
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        cache_dir: Path | None = None,
        dtype: torch.dtype | str = torch.float32,  # or "auto": the variant's own on a GPU (serving_dtype)
        query_source: str
        | None = None,  # with no query_encoder: all-MiniLM's HF id or path (settings.engine.query_encoder)
        query_cache_size: int = 1024,
        max_query_chars: int = MAX_QUERY_CHARS,
    ):
        self.variant = get_variant(variant)
        self.device = resolve_device(device)
        if isinstance(backend, Backend):
            self.backend = backend
            self.model = backend.model
        else:
            self.model = create_model(variant, weights, self.device)
            dtype = serving_dtype(dtype, self.device, self.variant.gpu_dtype, backend)
            self.backend = create_backend(backend, self.model, self.device, buckets, dtype, cache_dir)
        # the variant's own (CLIP's text tower), else all-MiniLM-L6-v2
        self.encoder = query_encoder or query_encoder_for(
            self.model, query_source, query_cache_size, max_query_chars
        )
        self.limits = limits
        # one decoding path per device (arrcoc.preprocess): every caller of this pipeline gets the
        # same pixels for the same bytes
        self.decoder = Decoder(self.device, self.variant.image_size, limits, self.resample)

    @property
    def resample(self) -> str:
        """How images are resized to the model's input: the variant's own (CLIP: bicubic)."""
        return getattr(self.model.config, "resample", "bilinear")

    def warmup(self) -> None:
        self.backend.warmup()

    @property
    def weights_version(self) -> str:
        return getattr(self.model, "weights_version", "untrained")

    def infer(
        self,
        images: list[ImageLike] | ImageLike,
        queries: list[str] | str,
        controls: list[Controls] | Controls | None = None,
    ) -> list[RelevanceResult]:
        """One result per image. A single query (or Controls) applies to every image."""
        if not isinstance(images, list):
            images = [images]
        n = len(images)
        if n == 0:
            raise InvalidInputError("No images given.")
        queries = [queries] * n if isinstance(queries, str) else list(queries)
        if len(queries) != n:
            raise InvalidInputError(f"{n} images but {len(queries)} queries.")
        controls = [controls or Controls()] * n if not isinstance(controls, list) else controls
        if len(controls) != n:
            raise InvalidInputError(f"{n} images but {len(controls)} control sets.")
        return self.run([self.prepare(im, q, c) for im, q, c in zip(images, queries, controls, strict=True)])

    def prepare(self, image: ImageLike, query: str, controls: Controls | None = None) -> PreparedRequest:
        """Everything per request that needs no model: checks, decoding (once), resizing.

        Servers call this in the request's own thread, so a batch waits only for the engine
        (Pillow releases the GIL while it decodes and resizes: requests prepare in parallel).
        """
        t0 = time.perf_counter()
        checked = self.checked_controls(controls)
        text = validate_query(query, self.encoder.max_chars)
        encoded = None
        if isinstance(image, (bytes, bytearray, str, Path)):
            got = self.decoder.start(
                read_bytes(image, self.limits)
            )  # on a GPU: checked, decoded with its batch
            pixels, size = (None, got.size) if isinstance(got, Encoded) else (got.pixels, got.size)
            encoded = got if isinstance(got, Encoded) else None
        else:  # an image already in memory (PIL, numpy)
            decoded = load_decoded(image, self.limits, self.variant.image_size)
            pixels, size = to_tensor(decoded.image, self.variant.image_size, self.resample), decoded.size
        return PreparedRequest(pixels, size, text, checked, (time.perf_counter() - t0) * 1e3, encoded)

    def prepare_many(
        self,
        images: Sequence[bytes],
        queries: Sequence[str],
        controls: Controls | None = None,
        view_side: int | None = None,
    ) -> list[tuple[PreparedRequest, torch.Tensor | None] | ArrcocError]:
        """A batch job's items decoded together (on the GPU when it can): per item the prepared
        request and, with `view_side`, the upright image at most that size on a side (for its
        overlay), or the item's error."""
        t0 = time.perf_counter()
        checked = self.checked_controls(controls)
        decoded = self.decoder.decode(images, view_side)
        ms = (time.perf_counter() - t0) * 1e3 / max(1, len(images))
        out: list[tuple[PreparedRequest, torch.Tensor | None] | ArrcocError] = []
        for got, query in zip(decoded, queries, strict=True):
            try:
                if isinstance(got, ArrcocError):
                    raise got
                out.append(
                    (
                        PreparedRequest(
                            got.pixels, got.size, validate_query(query, self.encoder.max_chars), checked, ms
                        ),
                        got.view,
                    )
                )
            except ArrcocError as e:
                out.append(e)
        return out

    def checked_controls(self, controls: Controls | None) -> Controls:
        cfg = self.model.config
        return (controls or Controls()).validated(cfg.grid * cfg.grid, cfg.k, cfg.token_budget)

    def run(self, requests: list[PreparedRequest]) -> list[RelevanceResult]:
        """Prepared requests -> one engine call (queries encoded together) -> one result each."""
        return self.launch(requests)().results()

    def launch(self, requests: list[PreparedRequest]) -> Callable[[], BatchResults]:
        """`run` in two steps: the engine call started now (with CUDA graphs, queued on the device), the
        returned function waits for its outputs. The thread is free in between: the interactive
        batcher decodes the next batch there."""
        if not requests:
            raise InvalidInputError("No images given.")
        t0, cpu0 = time.perf_counter(), time.thread_time()
        requests = self._decoded(requests)
        query_vecs = self.encoder.encode([r.query for r in requests])
        batch = torch.stack([r.pixels for r in requests])
        control_rows = torch.tensor([r.controls.as_row() for r in requests], dtype=torch.float32)
        wait = self.backend.launch_host(batch, query_vecs, control_rows)
        launched_ms, launch_cpu = (time.perf_counter() - t0) * 1e3, time.thread_time() - cpu0

        def collect() -> BatchResults:
            t1, cpu1 = time.perf_counter(), time.thread_time()
            out = wait()  # numpy arrays, sliced per item by BatchResults
            # the engine call's own time on this thread: launching it, then waiting for it (not
            # what the thread did in between)
            model_ms = launched_ms + (time.perf_counter() - t1) * 1e3
            # this thread's CPU for the batch, shared out: with the server's own CPU per request it
            # shows where a worker's CPU goes (`arrcoc submit loadtest` reports it: arrcoc/bench/load.py)
            cpu_ms = (launch_cpu + time.thread_time() - cpu1) * 1e3 / len(requests)
            # what every item of the batch shares, looked up once
            shared = {
                "variant": self.variant.name,
                "weights_version": self.weights_version,
                "backend": self.backend.name,
                "benchmark_only": self.variant.benchmark_only or self.weights_version == "random",
                "bucket": self.backend.bucket_for(out.relevance.shape[0]),
            }
            return BatchResults(out, out.budgets.astype(np.int64), requests, shared, model_ms, cpu_ms)

        return collect

    def decode_pending(
        self, requests: list[PreparedRequest], stamp: Callable[[], float] | None = None
    ) -> list[PreparedRequest | ArrcocError]:
        """What `prepare` left for the GPU, decoded in one call: per request the request with its
        pixels, or its ImageError. `stamp()`, called once the batch is decoded, gives the decode
        stage's time, set on every request (`batch_decode_ms`)."""
        pending = [i for i, r in enumerate(requests) if r.pixels is None]
        got = dict(
            zip(
                pending,
                self.decoder.finish([requests[i].encoded for i in pending]) if pending else [],
                strict=True,
            )
        )
        ms = stamp() if stamp is not None else None
        out: list[PreparedRequest | ArrcocError] = []
        for i, r in enumerate(requests):
            g = got.get(i)
            if isinstance(g, ArrcocError):
                out.append(g)
            elif g is None and ms is None:
                out.append(r)
            else:  # by its constructor: dataclasses.replace is slower, and this runs per request of a batch
                pixels, encoded = (r.pixels, r.encoded) if g is None else (g.pixels, None)
                out.append(
                    PreparedRequest(
                        pixels=pixels,
                        size=r.size,
                        query=r.query,
                        controls=r.controls,
                        prepare_ms=r.prepare_ms,
                        encoded=encoded,
                        batch_decode_ms=r.batch_decode_ms if ms is None else ms,
                    )
                )
        return out

    def _decoded(self, requests: list[PreparedRequest]) -> list[PreparedRequest]:
        """The batch's pixels: what `prepare` left for the GPU decodes here, in one call."""
        out = self.decode_pending(requests)
        for got in out:
            if isinstance(got, ArrcocError):
                raise got  # the caller runs the items one by one: this one fails alone
        return out  # type: ignore[return-value]


@dataclass(frozen=True)
class BatchResults:
    """A batch's outputs on the host; `result(i)` builds item i's RelevanceResult in the thread that
    asks. The interactive batcher hands each caller its item unbuilt, so that sixteen results are
    not built one after another on the batcher's serial thread while the next batch waits
    (docs/service.md#concurrency)."""

    out: ModelOutput  # the engine's outputs as numpy arrays over the batch
    budgets: np.ndarray  # out.budgets as int64
    requests: list[PreparedRequest]
    shared: dict[str, Any]  # what every item's result has the same
    model_ms: float
    cpu_ms: float  # the batch thread's CPU per item

    def __len__(self) -> int:
        return len(self.requests)

    def results(self) -> list[RelevanceResult]:
        return [self.result(i) for i in range(len(self.requests))]

    def result(self, i: int) -> RelevanceResult:
        out, r = self.out, self.requests[i]
        c = r.controls
        k = int(c.k)
        timings = {"preprocess_ms": r.prepare_ms, "model_ms": self.model_ms, "batch_cpu_ms": self.cpu_ms}
        if r.batch_decode_ms is not None:
            timings["batch_decode_ms"] = r.batch_decode_ms
        return RelevanceResult(
            query=r.query,
            relevance=out.relevance[i],
            information=out.information[i],
            perspectival=out.perspectival[i],
            participatory=out.participatory[i],
            balance=out.balance[i],
            tensions=out.tensions[i],
            selected=out.order[i, :k],
            budgets=self.budgets[i, :k].copy(),  # its own K entries, not a view of the batch's
            budget_map=out.budget_map[i],
            texture=out.texture[i],
            image_size=r.size,
            token_budget=int(c.token_budget),
            timings_ms=timings,
            match_score=float(out.match[i]),
            **self.shared,
        )
