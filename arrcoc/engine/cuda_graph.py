"""CUDA-graph capture for the PyTorch backends, in one place (after vLLM's cuda_graph.py).

One graph per bucket, captured at warmup, largest bucket first, all into one shared memory
pool. Each graph owns static input buffers (real rows are copied in; rows past them keep the
last valid data, never zeros) and static outputs (sliced and cloned out before the next
replay). Once capture is done the runner is frozen: asking for a bucket that was not
captured is an EngineError, never a late capture.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import EngineError

log = logging.getLogger(__name__)

Fn = Callable[..., tuple[Tensor, ...]]


@dataclass
class CapturedGraph:
    bucket: int
    graph: torch.cuda.CUDAGraph
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


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
        self.graphs: dict[int, CapturedGraph] = {}
        self.pool = None
        self.frozen = False
        self.stats = CaptureStats()

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
                static_out = self.fn(*static_in)
            graph.replay()  # the outputs hold a real result from the start
            self.graphs[bucket] = CapturedGraph(bucket, graph, tuple(static_in), tuple(static_out))
        torch.cuda.synchronize(self.device)
        self.stats = CaptureStats(
            time.perf_counter() - t0, (torch.cuda.memory_reserved(self.device) - reserved0) / 2**20
        )
        self.frozen = True
        log.info(
            "captured %d CUDA graphs %s in %.2f s, %.1f MiB",
            len(self.graphs), sorted(self.graphs), self.stats.capture_s, self.stats.memory_mb,
        )  # fmt: skip
        return self.stats

    def replay(self, bucket: int, *inputs: Tensor) -> tuple[Tensor, ...]:
        """Copy n <= bucket real rows in, replay, return the n rows of every output, cloned."""
        captured = self.graphs.get(bucket)
        if captured is None:
            raise EngineError(f"No CUDA graph was captured for bucket {bucket} (have {sorted(self.graphs)}).")
        n = inputs[0].shape[0]
        for dst, src in zip(captured.inputs, inputs, strict=True):
            if dst.shape[1:] != src.shape[1:]:
                raise EngineError(f"Input shape {tuple(src.shape)} does not fit the captured {tuple(dst.shape)}.")
            dst[:n].copy_(src, non_blocking=True)
        captured.graph.replay()
        return tuple(o[:n].clone() for o in captured.outputs)

    def close(self) -> None:
        self.graphs.clear()
        self.pool = None
