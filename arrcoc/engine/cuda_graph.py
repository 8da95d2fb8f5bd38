"""CUDA-graph capture for the PyTorch backends, in one place (after vLLM's cuda_graph.py).

One graph per bucket, captured at warmup, largest bucket first, all into one shared memory
pool. Each graph owns static input buffers (real rows are copied in; rows past them keep the
last valid data, never zeros) and static outputs (sliced and cloned out before the next
replay). Once capture is done the runner is frozen: asking for a bucket that was not
captured is an EngineError, never a late capture.

Each graph also packs its outputs, row by row, into one byte buffer (`RowLayout`), so that
`launch_host` brings a batch's every output to the host in one copy. On a server every torch
call lets another thread take the GIL; eleven clones, eleven copies and their bookkeeping per
batch would be the bulk of an interactive engine stage's calls (docs/service.md#dynamic-batching).

Callers take turns (the engine host's device lock) but may launch from different CUDA streams, and
need not wait for a launch to finish before the next: every use of the static buffers waits, on
the device, for the previous use to be done (an event), so a call launches while the one before it
still runs and neither sees the other's rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import EngineError

log = logging.getLogger(__name__)

Fn = Callable[..., tuple[Tensor, ...]]


# each output's row starts on this many bytes, so that every field read back is aligned
ROW_ALIGN = 8


@dataclass(frozen=True)
class Field:
    dtype: np.dtype
    shape: tuple[int, ...]  # one row's
    offset: int  # bytes into the packed row
    nbytes: int


@dataclass(frozen=True)
class RowLayout:
    """Where each output of one batch row lies in a packed row of bytes."""

    fields: tuple[Field, ...]
    row_bytes: int

    @classmethod
    def of(cls, outputs: tuple[Tensor, ...]) -> RowLayout:
        fields, offset = [], 0
        for t in outputs:
            row = tuple(t.shape[1:])
            nbytes = int(np.prod(row, dtype=np.int64)) * t.element_size()
            fields.append(Field(np.dtype(str(t.dtype).removeprefix("torch.")), row, offset, nbytes))
            offset += -(-nbytes // ROW_ALIGN) * ROW_ALIGN
        return cls(tuple(fields), offset)

    def pack(self, outputs: tuple[Tensor, ...]) -> Tensor:
        """(B, row_bytes) uint8: the outputs' rows side by side (runs inside the captured graph)."""
        b = outputs[0].shape[0]
        parts = []
        for f, t in zip(self.fields, outputs, strict=True):
            parts.append(t.reshape(b, -1).contiguous().view(torch.uint8))
            pad = -f.nbytes % ROW_ALIGN
            if pad:
                parts.append(torch.zeros(b, pad, dtype=torch.uint8, device=t.device))
        return torch.cat(parts, dim=1)

    def unpack(self, packed: np.ndarray) -> list[np.ndarray]:
        """(n, row_bytes) uint8 on the host -> each output as an (n, ...) view of it, no copy."""
        n = packed.shape[0]
        return [
            packed[:, f.offset : f.offset + f.nbytes].view(f.dtype).reshape(n, *f.shape) for f in self.fields
        ]


@dataclass
class CapturedGraph:
    bucket: int
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    packed: Tensor  # (bucket, layout.row_bytes) uint8, written by the same replay


@dataclass
class CaptureStats:
    capture_s: float = 0.0  # all buckets, warm-up replays on the side stream included
    memory_mb: float = 0.0  # growth of the caching allocator's reserved memory during capture


class CudaGraphRunner:
    def __init__(self, fn: Fn, make_inputs: Callable[[int], tuple[Tensor, ...]], device: torch.device):
        if device.type != "cuda":
            raise EngineError("CUDA graphs need a CUDA device.")
        self.fn = fn
        self.make_inputs = make_inputs
        self.device = device
        # the device's index, resolved once: current_stream(device) with no index asks
        # torch.cuda.is_available() (an environment read) on every launch
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self.graphs: dict[int, CapturedGraph] = {}
        self.pool = None
        self.frozen = False
        self.stats = CaptureStats()
        self.layout: RowLayout | None = None
        self._done: torch.cuda.Event | None = None  # the last use of the static buffers, finished

    @torch.inference_mode()
    def capture(self, buckets: tuple[int, ...], warm_iters: int = 2) -> CaptureStats:
        if self.frozen:
            raise EngineError("CUDA graphs were already captured; capture happens once, in warmup().")
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # a clean baseline: the growth below is the graphs' pool
        reserved0 = torch.cuda.memory_reserved(self.device)
        t0 = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        for bucket in sorted(buckets, reverse=True):  # largest first: smaller ones reuse its pool
            static_in = self.make_inputs(bucket)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm on a side stream, as graph capture requires
                for _ in range(warm_iters):
                    self.fn(*static_in)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                static_out = tuple(self.fn(*static_in))
                self.layout = self.layout or RowLayout.of(static_out)
                packed = self.layout.pack(static_out)
            graph.replay()  # the outputs hold a real result from the start
            self.graphs[bucket] = CapturedGraph(bucket, graph, tuple(static_in), static_out, packed)
        torch.cuda.synchronize(self.device)
        self.stats = CaptureStats(
            time.perf_counter() - t0, (torch.cuda.memory_reserved(self.device) - reserved0) / 2**20
        )
        self.frozen = True
        log.info(
            "captured %d CUDA graphs %s in %.2f s, %.1f MiB",
            len(self.graphs),
            sorted(self.graphs),
            self.stats.capture_s,
            self.stats.memory_mb,
        )
        return self.stats

    def replay(self, bucket: int, *inputs: Tensor) -> tuple[Tensor, ...]:
        """Copy n <= bucket real rows in, replay, return the n rows of every output, cloned."""
        self._after_previous()
        captured = self._replayed(bucket, inputs)
        n = inputs[0].shape[0]
        out = tuple(o[:n].clone() for o in captured.outputs)
        self._released()
        return out

    def launch_host(
        self, split: Sequence[tuple[int, int, int]], *inputs: Tensor
    ) -> Callable[[], list[np.ndarray]]:
        """As `replay` for a batch of any size, its outputs on the host: each (lo, hi, bucket)
        piece of `split` replayed in turn and its rows copied into one pinned buffer. The replays
        and copies are queued now; the returned function waits for them and gives the outputs as
        numpy views of that buffer (which the arrays own). The calling thread is free in between,
        and the next launch may be queued first. Inputs may be on the host: each is copied
        straight into its static buffer."""
        n = inputs[0].shape[0]
        host = torch.empty((n, self.layout.row_bytes), dtype=torch.uint8, pin_memory=True)
        self._after_previous()
        for lo, hi, bucket in split:
            captured = self._replayed(bucket, tuple(t[lo:hi] for t in inputs))
            host[lo:hi].copy_(captured.packed[: hi - lo], non_blocking=True)
        copied = self._released()
        layout = self.layout

        def wait() -> list[np.ndarray]:
            copied.synchronize()
            return layout.unpack(host.numpy())

        return wait

    def _replayed(self, bucket: int, inputs: tuple[Tensor, ...]) -> CapturedGraph:
        captured = self.graphs.get(bucket)
        if captured is None:
            raise EngineError(f"No CUDA graph was captured for bucket {bucket} (have {sorted(self.graphs)}).")
        n = inputs[0].shape[0]
        for dst, src in zip(captured.inputs, inputs, strict=True):
            if dst.shape[1:] != src.shape[1:]:
                raise EngineError(
                    f"Input shape {tuple(src.shape)} does not fit the captured {tuple(dst.shape)}."
                )
            dst[:n].copy_(src, non_blocking=True)
        captured.graph.replay()
        return captured

    def _after_previous(self) -> None:
        """This stream waits, on the device, for the previous use of the static buffers (perhaps
        launched from another stream) to end before this use begins."""
        if self._done is not None:
            torch.cuda.current_stream(self._index).wait_event(self._done)

    def _released(self) -> torch.cuda.Event:
        """Marks, on this stream, where this use of the static buffers ends (after its outputs
        were copied out): the next use waits for it."""
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(self._index))
        self._done = done
        return done

    def close(self) -> None:
        self.graphs.clear()
        self.pool = None


@torch.inference_mode()
def replayer(fn: Callable[..., object], *inputs: Tensor, warm_iters: int = 2) -> Callable[[], None]:
    """fn(*inputs) captured once in a CUDA graph on these very inputs; the returned function
    replays it, nothing copied in or out: what a benchmark times as a function's device work
    (arrcoc bench selection), apart from the Python of calling it."""
    device = inputs[0].device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm on a side stream, as graph capture requires
        for _ in range(warm_iters):
            fn(*inputs)
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*inputs)
    return graph.replay
