"""The engine host's one pipeline: gather -> decode -> engine -> outputs, per backend served.

- **gather**: interactive requests, submitted from many threads, into batches of at most the
  batcher's size and delay (`arrcoc.service.host.batching.DynamicBatcher`, the dynamic batcher,
  which drives the stages below on its one thread). A batch job's step enters at decode, its
  items gathered already (`Runtime.process`).
- **decode**: an interactive batch's JPEGs, which `prepare` only checked, in one nvJPEG call on a
  stream of its own (`Stages.decode`; elsewhere requests arrive decoded, in their own threads); a
  step's images, and their overlays' views, together (`RelevancePipeline.prepare_many`).
- **engine**: one engine call, started under the device lock and waited for later, padded to its
  bucket (`Stages.engine_calls`); a call that fails to start runs again item by item
  (`arrcoc.isolation.isolated`), so a bad item fails only itself.
- **outputs**: per interactive request its result, built by the request's own thread
  (`Stages.engine`, `arrcoc.pipeline.BatchResults`); per step its results as columns
  (`Stages.run_step`, `step_outputs`) and its overlays (`Runtime._process`).

The sink is the caller's: the request's thread, or the batch job's step thread that writes its
part (`arrcoc.service.jobs.batch`). What runs in which thread: docs/service.md#concurrency.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...isolation import isolated
from ..codec import error_to_wire
from .interface import MAPS, StepOutputs

if TYPE_CHECKING:
    from ...errors import ArrcocError
    from ...pipeline import BatchResults, PreparedRequest, RelevancePipeline
    from ...result import RelevanceResult

ItemResult = Callable[[], "RelevanceResult"]  # builds one item's result, in the thread that calls it


@contextlib.contextmanager
def on_stream(stream: torch.cuda.Stream) -> Iterator[None]:
    """`torch.cuda.stream(stream)` without its device lookups, each of which asks
    torch.cuda.is_available() (an environment read): the interactive batcher enters a stream for
    every batch, on its one serial thread (docs/service.md#concurrency)."""
    previous = torch.cuda.current_stream(stream.device_index)
    torch.cuda.set_stream(stream)
    try:
        yield
    finally:
        torch.cuda.set_stream(previous)


class Stages:
    """One backend's decode, engine and outputs stages on this engine host."""

    def __init__(
        self,
        pipe: RelevancePipeline,
        device_lock: threading.RLock,
        thread_stream: Callable[[torch.device], torch.cuda.Stream | None],
    ):
        self.pipe = pipe
        self.device_lock = device_lock  # held while an engine call starts; a benchmark holds it throughout
        self.thread_stream = thread_stream  # the calling thread's own CUDA stream (Runtime._thread_stream)
        # on a GPU that decodes JPEGs, a gathered batch decodes on a stream of its own while the
        # device runs the batch before (the gather stage overlaps them); elsewhere nothing to overlap
        self.overlap = pipe.decoder.gpu

    # -- decode ----------------------------------------------------------------------------
    def decode(self, requests: list[PreparedRequest]) -> list[PreparedRequest | ArrcocError]:
        """An interactive batch: what `prepare` left for the GPU decoded, per request the request
        with its pixels or its ImageError (off the GPU decoder, the requests as they came)."""
        if not self.overlap:
            return requests
        stream = self.thread_stream(self.pipe.device)  # the batcher's, beside the engine's
        t0 = time.perf_counter()

        def stamp() -> float:
            # the engine's stream reads these pixels: they must be whole first; and they are
            # freed only after the engine's outputs came back to the host, so the allocator
            # may reuse them. (A plain wait: handing the engine a CUDA event instead was no faster.)
            # The decoder has waited for nvJPEG's part already; this also covers a photo nvJPEG
            # refused, which Pillow decoded and copied over without waiting.
            stream.synchronize()
            return (time.perf_counter() - t0) * 1e3  # batch_decode_ms, in each result's timings

        with on_stream(stream):
            return self.pipe.decode_pending(requests, stamp)

    # -- engine ----------------------------------------------------------------------------
    def engine_calls(
        self, requests: list[PreparedRequest]
    ) -> Callable[[], list[tuple[list[int], BatchResults | Exception]]]:
        """The requests in one engine call, started now; the returned function waits for it: per
        call, its requests' positions and its outputs or error (one call, or one per request when
        the batch failed to start: `isolated`). The device is held while the call starts: the next
        may start before this one ends, its work queued behind this one's on the device
        (arrcoc.engine.cuda_graph)."""
        with self.device_lock:
            return isolated(self.pipe.launch, requests)

    # -- outputs ---------------------------------------------------------------------------
    def engine(self, requests: list[PreparedRequest]) -> Callable[[], list[ItemResult | Exception]]:
        """`engine_calls` with per request its result left unbuilt (or its error): the gather
        stage hands it to the request's own thread, which builds it."""
        wait = self.engine_calls(requests)
        return lambda: per_item(wait(), len(requests))

    def run_step(self, requests: list[PreparedRequest | None], errors: list[str | None]) -> StepOutputs:
        """A step's decoded requests (None where an item already failed) through the engine, its
        outputs as columns; an item the engine refuses fails alone (`errors` gets its message)."""
        ok = [i for i, r in enumerate(requests) if r is not None]
        ran: list[tuple[list[int], BatchResults]] = []
        if ok:
            for positions, got in self.engine_calls([r for r in requests if r is not None])():
                at = [ok[j] for j in positions]
                if isinstance(got, Exception):
                    for i in at:
                        errors[i] = error_to_wire(got)["message"]
                else:
                    ran.append((at, got))
        return step_outputs(len(requests), ran)


def per_item(ran: list[tuple[list[int], BatchResults | Exception]], n: int) -> list[ItemResult | Exception]:
    """Engine calls' outcomes as one entry per request: a function that builds its result, or its error."""
    out: list[ItemResult | Exception | None] = [None] * n
    for positions, got in ran:
        for j, i in enumerate(positions):
            out[i] = got if isinstance(got, Exception) else functools.partial(got.result, j)
    return out  # type: ignore[return-value] -- every position is some call's


def step_outputs(n: int, ran: list[tuple[list[int], BatchResults]]) -> StepOutputs:
    """The outputs of a step's engine calls (`ran`: each call's items' positions and its outputs)
    as arrays over the step's n items, each field filled per call, not per item."""
    if not ran:
        return StepOutputs.failed(n)
    first = ran[0][1]
    grid = first.out.relevance.shape[-1]
    c = first.requests[0].controls  # one job, one set of controls
    k = int(c.k)
    ok = np.zeros(n, bool)
    maps = {name: np.zeros((n, grid, grid), np.float32) for name in MAPS}
    selected, budgets = np.zeros((n, k), np.int32), np.zeros((n, k), np.int32)
    balance, tensions = np.zeros((n, 3), np.float32), np.zeros((n, 3), np.float32)
    match, bucket = np.zeros(n, np.float32), np.zeros(n, np.int32)
    size = np.zeros((n, 2), np.int32)
    for positions, batch in ran:
        at, out = np.asarray(positions), batch.out
        ok[at] = True
        for name in MAPS:
            maps[name][at] = getattr(out, name)
        selected[at], budgets[at] = out.order[:, :k], batch.budgets[:, :k]
        balance[at], tensions[at], match[at] = out.balance, out.tensions, out.match
        size[at] = [r.size for r in batch.requests]
        bucket[at] = batch.shared["bucket"]
    s = first.shared
    return StepOutputs(
        ok=ok,
        selected=selected,
        budgets=budgets,
        balance=balance,
        tensions=tensions,
        match_score=match,
        image_size=size,
        bucket=bucket,
        token_budget=int(c.token_budget),
        variant=s["variant"],
        weights_version=s["weights_version"],
        backend=s["backend"],
        **maps,
    )
