"""torch.compile (Inductor, fullgraph); on CUDA each bucket is also captured as a CUDA graph.
Everything is compiled and captured in warmup(); serving runs under the "fail_on_recompile"
stance, so a stray shape is an EngineError, not a compile.

Programs: by default two, not one per bucket (start-up was 7 compiles of the same graph): bucket
1 specialised, and one program with a dynamic batch dimension (2..largest) for the others; a
CUDA graph per bucket is captured over them as before. On a CPU the dynamic program can split
where a kernel choice depends on the batch size (see `_marked`): warmup runs every bucket, so
each part is compiled there, never while serving. `dynamic_batch=False` compiles one
specialised program per bucket. The first warmup on a cache dir saves PyTorch's portable
cache artefacts (Inductor, Triton, AOTAutograd, autotuning) to <cache_dir>/compiled/<key>.bin;
a process on another cache dir holding only that file (a new host) loads it first and starts
warm; one on the same cache dir skips both (its Inductor cache already holds them). stats hold
where the time went (compile_phases, artefacts_load_s).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import torch
from torch import Tensor

from ..errors import EngineError
from .base import Backend, ForwardFn, example_inputs, pad_rows
from .caches import configure_compile_caches, model_fingerprint
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

    def __init__(
        self, *args, cuda_graphs: bool = True, mode: str | None = None, dynamic_batch: bool = True, **kwargs
    ):
        super().__init__(*args, **kwargs)
        self.use_graphs = cuda_graphs and self.device.type == "cuda"
        self.mode = mode  # Inductor mode; None = default (our own CUDA graphs, not Inductor's)
        self.dynamic_batch = dynamic_batch and len([b for b in self.buckets if b > 1]) > 1
        self.graphs: CudaGraphRunner | None = None
        self.compiles_at_warmup = 0
        self.phases: dict[str, float] = {}  # compile time by phase (Dynamo's own timers), seconds

    def warmup(self) -> None:
        if self.warmed:
            return
        t_start = time.perf_counter()
        configure_compile_caches(self.cache_dir)
        import torch._dynamo.config as dynamo_config

        # one graph per program, and several backends per process (bench, tests) share the code
        limit = max(64, 2 * len(self.buckets) + 2)
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))
        if hasattr(dynamo_config, "accumulated_recompile_limit"):
            dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, 256)
        self._eager = ForwardFn(self.model, self.device.type, self.dtype)
        # dynamic=None: specialised unless a tensor is marked dynamic (the shared batch dim below)
        self._fn = torch.compile(
            self._eager, fullgraph=True, dynamic=None if self.dynamic_batch else False, mode=self.mode
        )
        t_path = time.perf_counter()
        self.stats["setup_s"] = t_path - t_start  # cache config, compiler imports, the torch.compile wrapper
        artefacts = self._artefacts_path()
        self.stats["fingerprint_s"] = time.perf_counter() - t_path  # the key hashes code and weights
        # a marker in the Inductor cache says it already holds what the artefacts hold (it made
        # them): loading them again, and saving them again, is only start-up time lost
        marker = self.cache_dir / "inductor" / f"arrcoc-{artefacts.stem}.present" if artefacts else None
        local = marker is not None and marker.is_file()
        t_load = time.perf_counter()
        self.stats["artefacts_loaded"] = float(not local and _load_artefacts(artefacts))
        self.stats["artefacts_load_s"] = time.perf_counter() - t_load
        t0 = time.perf_counter()
        before = _phase_totals()
        compiles0 = compile_count()
        first: dict[str, float] = {}  # each program's first call: trace, compile or cache load, first run
        with torch.inference_mode():
            for bucket in self._compile_buckets():
                t = time.perf_counter()
                self._fn(*self._marked(example_inputs(self.model, bucket, self.device)))
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                first[f"b{bucket}"] = time.perf_counter() - t
            # every other bucket once, compiles allowed: where the shared program's guards leave a
            # bucket out (a CPU's conv backend depends on the batch size), its program is built here
            for bucket in sorted(set(self.buckets) - set(self._compile_buckets()), reverse=True):
                t = time.perf_counter()
                n = compile_count()
                self._fn(*self._marked(example_inputs(self.model, bucket, self.device)))
                if compile_count() > n:
                    first[f"b{bucket}"] = time.perf_counter() - t
        self.stats["compile_s"] = time.perf_counter() - t0
        self.stats["first_call_s"] = first
        t_post = time.perf_counter()
        self.phases = {
            k: v - before.get(k, 0.0) for k, v in _phase_totals().items() if v - before.get(k, 0.0) > 0.05
        }
        self.stats["compile_phases"] = self.phases
        self.stats["programs"] = float(compile_count() - compiles0)
        self.stats["artefacts_saved"] = float(not local and _save_artefacts(artefacts))
        if marker is not None and not local:
            marker.touch()
        self.stats["post_compile_s"] = time.perf_counter() - t_post  # compile timers, artefacts saved
        if not self.use_graphs:  # every bucket served once now: a missed shape fails here, not later
            with torch.inference_mode():
                for bucket in self.buckets:
                    self._guarded(*self._static_inputs(bucket))
        if self.use_graphs:
            self.graphs = CudaGraphRunner(self._guarded, self._static_inputs, self.device)
            st = self.graphs.capture(self.buckets)
            self.stats["capture_s"], self.stats["capture_mem_mb"] = st.capture_s, st.memory_mb
        self.compiles_at_warmup = compile_count()
        self.warmed = True
        total = time.perf_counter() - t_start
        known = ("setup_s", "fingerprint_s", "artefacts_load_s", "compile_s", "post_compile_s", "capture_s")
        self.stats["warmup_total_s"] = total
        self.stats["warmup_other_s"] = total - sum(self.stats.get(k, 0.0) for k in known)
        log.info(
            "compiled %s buckets %s in %.1f s",
            type(self.model).__name__,
            self.buckets,
            self.stats["compile_s"],
        )

    def _compile_buckets(self) -> list[int]:
        """The buckets whose shapes are compiled: one per program (largest first)."""
        if not self.dynamic_batch:
            return sorted(self.buckets, reverse=True)
        return sorted({b for b in self.buckets if b == 1} | {max(self.buckets)}, reverse=True)

    def _marked(self, inputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Mark the batch dim of every input dynamic for the shared program.

        Bucket 1 stays specialised: Dynamo treats a size of 1 as a constant anyway, and batch 1
        is the latency that matters most. On CUDA the range is declared (2..largest bucket):
        Inductor proves 32-bit indexing from the bound, and no kernel choice there depends on the
        batch size. On a CPU the convolution's backend (oneDNN or not) is chosen by batch size,
        so the traced program guards on it (e.g. 16 <= batch) and a declared range would be a
        ConstraintViolationError: there the dim is only hinted dynamic, and warmup builds a
        program for each range the buckets fall in."""
        if self.dynamic_batch and inputs[0].shape[0] > 1:
            for t in inputs:
                if self.device.type == "cuda":
                    torch._dynamo.mark_dynamic(t, 0, min=2, max=max(self.buckets))
                else:
                    torch._dynamo.maybe_mark_dynamic(t, 0)
        return inputs

    def _artefacts_path(self):
        if self.cache_dir is None:
            return None
        from .aot import device_tag

        key = f"{model_fingerprint(self.model)}-{device_tag(self.device)}-{self.dtype}-{self.dynamic_batch}"
        return self.cache_dir / "compiled" / f"{key}-{'_'.join(map(str, self.buckets))}.bin"

    def _static_inputs(self, bucket: int) -> tuple[Tensor, ...]:
        return example_inputs(self.model, bucket, self.device, seed=1000)

    def _guarded(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        # only the buckets warmup ran are served: a CPU's dynamic program has no declared upper
        # bound (see _marked), so its guards alone would let another batch size through
        if inputs[0].shape[0] not in self.buckets:
            raise EngineError(
                f"The compiled backend was asked for batch {inputs[0].shape[0]}, which is not one of the"
                f" buckets it compiled ({', '.join(map(str, self.buckets))})"
            )
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
        args = [
            pad_rows(t, bucket) if n < bucket or t.is_inference() else t.clone()
            for t in (images, query, controls)
        ]
        out = self._guarded(*args)
        return out if n == bucket else tuple(t[:n].clone() for t in out)

    def close(self) -> None:
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None


def _phase_totals() -> dict[str, float]:
    """Dynamo's cumulative compile timers (Dynamo tracing, AOTAutograd, Inductor, codegen and
    Triton/C++ compile...), seconds by phase name; names vary between torch versions."""
    from torch._dynamo.utils import compilation_time_metrics

    return {k: float(sum(v)) for k, v in compilation_time_metrics.items()}


def _load_artefacts(path) -> bool:
    if path is None or not path.is_file():
        return False
    try:
        return torch.compiler.load_cache_artifacts(path.read_bytes()) is not None
    except Exception as e:  # a damaged or foreign file: compile as if it were not there
        log.warning("ignoring compile-cache artefacts %s: %s", path, e)
        return False


def _save_artefacts(path) -> bool:
    """Write the portable cache artefacts of what this process compiled (atomically)."""
    if path is None:
        return False
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(saved[0])
    os.replace(tmp, path)
    return True
