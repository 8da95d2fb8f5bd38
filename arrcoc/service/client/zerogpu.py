"""The executor of a Hugging Face Space: its model work inside `@spaces.GPU` functions.

On ZeroGPU (the platform sets SPACES_ZERO_GPU) a slice of a GPU is attached only while a function
decorated with `spaces.GPU` runs, in a worker process forked from the app's process that is kept
for later calls; outside such functions there is no GPU, and compiling at request time is not
available: ahead-of-time packages (the `aot` backend) are the documented route. So here:

- `prepare()`, called once at the Space's start, runs `build_packages` (decorated, with a long
  duration): the serving variant's `aot` packages are built into the cache dir (the Space's
  persistent storage, /data, when it has one: app.py) unless they are there already, then loaded;
  a later start finds them and only loads them;
- every interactive request runs `gpu_infer` (decorated): the request goes through a Runtime in
  that worker process, built there on first use and kept with the process;
- batch and benchmark jobs run on the CPU in the app's own process: their job state lives there,
  and what a forked worker writes to it would be lost.

Off ZeroGPU `spaces.GPU` returns the function itself (and without the `spaces` package a stand-in
does): on a CPU Space, or anywhere else, the same functions run in this process on its Runtime,
eager on the CPU.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from ...errors import ArrcocError
from ...request import Controls
from ...result import RelevanceResult
from ...settings import Settings, get_settings
from ...tuning import ZEROGPU_BUILD_S, ZEROGPU_INFER_S
from ..host.runtime import Runtime
from .inprocess import InProcessExecutor

log = logging.getLogger(__name__)


try:
    import spaces

    GPU: Callable[..., Any] = spaces.GPU
except ImportError:  # not on a Space: the functions below run as they are

    def GPU(task: Callable | None = None, *, duration: float | None = None, **_: Any) -> Any:  # noqa: N802
        return task if task is not None else (lambda f: f)


def on_zero_gpu() -> bool:
    """Whether this process is a ZeroGPU Space's (GPU only inside `spaces.GPU` functions)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


# The Runtime the decorated functions use, one per process: in a ZeroGPU worker the first call
# there builds it from _settings (set before the worker is forked); elsewhere it is the executor's.
_settings: Settings | None = None
_runtime: Runtime | None = None


def _gpu_runtime() -> Runtime:
    global _runtime
    if _runtime is None:
        if on_zero_gpu():
            # a worker forked from the app's process, whose OpenMP pool may have run (its CPU jobs):
            # a parallel region here could wait forever on threads that were not forked. One CPU
            # thread, as PyTorch's DataLoader workers do; the GPU does the work.
            torch.set_num_threads(1)
        _runtime = Runtime(_settings or get_settings())
    return _runtime


@GPU(duration=ZEROGPU_INFER_S)
def gpu_infer(
    image: bytes, query: str, controls: Controls, timeout: float, backend: str | None
) -> RelevanceResult | ArrcocError:
    """One request on the GPU's Runtime. A user's error comes back as a value: the platform would
    turn a raised one into a generic "GPU task aborted", losing what to fix."""
    try:
        return _gpu_runtime().infer(image, query, controls, timeout, backend)
    except ArrcocError as e:
        return e


@GPU(duration=ZEROGPU_BUILD_S)
def build_packages() -> dict[str, Any]:
    """Build what is missing (aot: the packages, one at a time, into the cache dir) and warm the
    Runtime's engine; -> what was done, for the log."""
    t0 = time.perf_counter()
    runtime = _gpu_runtime()
    s = runtime.settings
    built: list[str] = []
    if s.engine.backend == "aot":
        built = _build_aot(s, runtime)
    runtime.warm()
    pipe = runtime.pipeline
    return {
        "variant": s.engine.variant,
        "backend": pipe.backend.name,
        "device": str(pipe.device),
        "dtype": str(pipe.backend.dtype).removeprefix("torch."),
        "built": built,
        "cache_dir": str(s.service.cache_dir),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _build_aot(s: Settings, runtime: Runtime) -> list[str]:
    """The aot packages built in this process, one at a time (a ZeroGPU slice belongs to the
    process it was attached to: no build processes of their own); the Runtime then loads them."""
    from ...engine import create_backend, resolve_device
    from ...engine.base import serving_dtype
    from ...registry import create_model, get_variant

    device = resolve_device(s.engine.device)
    model = create_model(s.engine.variant, s.engine.weights or "default", device)
    dtype = serving_dtype(s.engine.dtype, device, get_variant(s.engine.variant).gpu_dtype, "aot")
    backend = create_backend("aot", model, device, runtime.buckets, dtype, s.service.cache_dir, processes=1)
    times = backend.prepare()
    del backend, model
    return [f"b{lo}-{hi}" if lo != hi else f"b{lo}" for lo, hi in sorted(times)]


class SpacesExecutor(InProcessExecutor):
    """InProcessExecutor whose interactive requests run in `gpu_infer`. On ZeroGPU its own Runtime
    (batch and benchmark jobs) runs eager on the CPU and the requests' Runtime lives in the GPU
    worker; elsewhere both are one Runtime."""

    def __init__(self, settings: Settings | None = None):
        global _settings, _runtime
        settings = settings or get_settings()
        local = settings
        if on_zero_gpu():
            local = settings.replace(engine={"device": "cpu", "backend": "eager", "backends": ("eager",)})
        super().__init__(local)
        _settings = settings
        _runtime = None if on_zero_gpu() else self.runtime

    def prepare(self) -> dict[str, Any]:
        """Once at the start: packages built or loaded and the engine warm (in the GPU worker on ZeroGPU)."""
        done = build_packages()
        log.info("Space ready: %s", done)
        return done

    def warmup(self) -> None:
        self.prepare()

    def infer(
        self,
        image: bytes,
        query: str,
        controls: Controls | None = None,
        timeout: float = 60.0,
        backend: str | None = None,
    ) -> RelevanceResult:
        self._check_types(image, controls)
        got = gpu_infer(bytes(image), query, controls or Controls(), timeout, backend)
        if isinstance(got, ArrcocError):
            raise got
        return got


__all__ = ["GPU", "SpacesExecutor", "build_packages", "gpu_infer", "on_zero_gpu"]
