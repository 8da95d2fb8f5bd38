"""torch.compile (Inductor, fullgraph): one specialised graph per bucket; on CUDA each bucket
is also captured as a CUDA graph. Everything is compiled and captured in warmup(); serving
runs under the "fail_on_recompile" stance, so a stray shape is an EngineError, not a compile.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
from torch import Tensor

from ..errors import EngineError
from .base import Backend, ForwardFn, example_inputs, pad_rows
from .caches import configure_compile_caches
from .cuda_graph import CudaGraphRunner

log = logging.getLogger(__name__)


def compile_count() -> int:
    """Graphs Dynamo has compiled in this process (recompiles included)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def no_recompile():
    """Serving stance: any recompile raises (as an EngineError)."""
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            yield
    except EngineError:
        raise
    except Exception as e:  # Dynamo raises RuntimeError subclasses that vary by version
        if "recompil" in str(e).lower() or "fail_on_recompile" in str(e):
            raise EngineError(
                "The compiled backend was asked for a shape it was not compiled for during serving"
                f" ({type(e).__name__}); compile every bucket in warmup(). Details: {str(e)[:300]}"
            ) from e
        raise


class CompiledBackend(Backend):
    name = "compiled"

    def __init__(self, *args, cuda_graphs: bool = True, mode: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.mode = mode  # Inductor mode; None = default (our own CUDA graphs, not Inductor's)
        self.graphs: CudaGraphRunner | None = None
        self.compiles_at_warmup = 0

    def warmup(self) -> None:
        if self.warmed:
            return
        configure_compile_caches(self.cache_dir)
        import torch._dynamo.config as dynamo_config

        # one specialised graph per bucket: allow that many, plus slack
        limit = max(8, 2 * len(self.buckets) + 2)
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))
        if hasattr(dynamo_config, "accumulated_recompile_limit"):
            dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 256)
        self._eager = ForwardFn(self.model, self.device.type, self.dtype)
        self._fn = torch.compile(self._eager, fullgraph=True, dynamic=False, mode=self.mode)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for bucket in sorted(self.buckets, reverse=True):
                self._fn(*example_inputs(self.model, bucket, self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.stats["compile_s"] = time.perf_counter() - t0
        if self.use_graphs:
            self.graphs = CudaGraphRunner(self._guarded, self._static_inputs, self.device)
            st = self.graphs.capture(self.buckets)
            self.stats["capture_s"], self.stats["capture_mem_mb"] = st.capture_s, st.memory_mb
        self.compiles_at_warmup = compile_count()
        self.warmed = True
        log.info("compiled %s buckets %s in %.1f s", type(self.model).__name__, self.buckets, self.stats["compile_s"])

    def _static_inputs(self, bucket: int) -> tuple[Tensor, ...]:
        return example_inputs(self.model, bucket, self.device, seed=1000)

    def _guarded(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        with no_recompile():
            return self._fn(*inputs)

    @property
    def recompiles(self) -> int:
        """Graphs compiled since warmup finished (0 when serving behaves)."""
        return compile_count() - self.compiles_at_warmup if self.warmed else 0

    @torch.inference_mode()
    def _run_bucket(self, bucket: int, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        if self.graphs is not None:
            return self.graphs.replay(bucket, images, query, controls)
        n = images.shape[0]
        # inference tensors, as at warmup (Dynamo guards on it): pad_rows or a clone makes them
        args = [pad_rows(t, bucket) if n < bucket or t.is_inference() else t.clone() for t in (images, query, controls)]
        out = self._guarded(*args)
        return out if n == bucket else tuple(t[:n].clone() for t in out)

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
