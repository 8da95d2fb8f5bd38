"""The backend interface every engine backend implements, and what they share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..errors import EngineError
from ..model import CONTROL_FIELDS, ModelOutput
from ..settings import DEFAULT_BUCKETS
from .buckets import BucketTable

if TYPE_CHECKING:
    from .cuda_graph import CudaGraphRunner

FLOAT_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.bfloat16):
            raise EngineError(f"dtype {dtype} is not supported; use float32 or bfloat16.")
        return dtype
    try:
        return FLOAT_DTYPES[str(dtype).lower()]
    except KeyError:
        raise EngineError(f"Unknown dtype {dtype!r}; use float32 or bfloat16.") from None


# backends that run float32 only (the onnx backend refuses another dtype): "auto" serves them float32
FLOAT32_ONLY_BACKENDS = frozenset({"onnx"})


def serving_dtype(
    setting: str | torch.dtype, device: torch.device, preferred: str = "float32", backend: str | None = None
) -> torch.dtype:
    """The dtype an engine serves: the setting (float32, bfloat16), or for "auto" the variant's
    `preferred` dtype on a GPU (Variant.gpu_dtype) where the backend runs it, and float32 on a
    CPU, where bfloat16 has no tensor cores to gain from and is slower than float32 on most CPUs."""
    if isinstance(setting, str) and setting.lower() == "auto":
        if torch.device(device).type != "cuda" or backend in FLOAT32_ONLY_BACKENDS:
            return torch.float32
        return parse_dtype(preferred)
    return parse_dtype(setting)


class ForwardFn(nn.Module):
    """The one function every backend runs: the model's forward, as a plain tuple of float32
    (and int64) tensors, under autocast when a lower precision is asked for."""

    def __init__(self, model: nn.Module, device_type: str, dtype: torch.dtype):
        super().__init__()
        self.model = model
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        with torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            out = self.model(images, query, controls)
        return tuple(t.float() if t.is_floating_point() else t for t in out)


def example_inputs(
    model: nn.Module, batch: int, device: torch.device, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    """Random, never-zero inputs of one batch size: uint8 images, unit queries, default controls."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed + batch)
    images = torch.randint(
        1, 256, (batch, 3, cfg.image_size, cfg.image_size), dtype=torch.uint8, generator=gen
    )
    query = torch.nn.functional.normalize(torch.randn(batch, cfg.query_dim, generator=gen), dim=-1)
    return images.to(device), query.to(device), model.default_controls(batch, device)


class Backend(ABC):
    """warmup() once, then run() many times, then close().

    run() takes uint8 images (B, 3, S, S), query embeddings (B, Dq) and controls (B, 6) on any
    device, and returns a ModelOutput on the backend's device that the caller owns (never a
    view of a buffer the next call overwrites). Any B works: batches are padded up to the next
    bucket, or split across the largest one.
    """

    name: str = "?"
    graphs: CudaGraphRunner | None = None  # a CUDA graph per bucket, where the backend captures them

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        dtype: torch.dtype = torch.float32,
        cache_dir: Path | None = None,
    ):
        self.model = model.to(device).eval()
        self.device = device
        self.table = BucketTable(buckets)
        self.buckets = self.table.buckets
        self.dtype = parse_dtype(dtype)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.warmed = False
        # what warmup() cost, for reports: seconds compiling/exporting, capturing graphs, bytes
        self.stats: dict[str, Any] = {"compile_s": 0.0, "capture_s": 0.0, "capture_mem_mb": 0.0}

    @abstractmethod
    def warmup(self) -> None: ...

    @abstractmethod
    def _run_bucket(self, bucket: int, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        """Run n <= bucket real rows padded to `bucket`; return the n real rows, caller-owned."""

    def run(self, images: Tensor, query: Tensor, controls: Tensor | None = None) -> ModelOutput:
        if not self.warmed:
            raise EngineError(f"The {self.name} backend must be warmed up (warmup()) before run().")
        images, query, controls = self._checked(images, query, controls)
        parts = [
            self._run_bucket(bucket, images[lo:hi], query[lo:hi], controls[lo:hi])
            for lo, hi, bucket in self.table.split(images.shape[0])
        ]
        if len(parts) == 1:
            return ModelOutput(*parts[0])
        return ModelOutput(*(torch.cat(ts) for ts in zip(*parts, strict=True)))

    def run_host(self, images: Tensor, query: Tensor, controls: Tensor | None = None) -> ModelOutput:
        """As run(), the outputs on the host as numpy arrays."""
        return self.launch_host(images, query, controls)()

    def launch_host(
        self, images: Tensor, query: Tensor, controls: Tensor | None = None
    ) -> Callable[[], ModelOutput]:
        """`run_host` in two steps: the batch started now, the returned function waits for its
        outputs on the host. With captured CUDA graphs the batch is queued on the device, split
        across the largest bucket where it must be (its inputs copied straight from where they are
        into the graphs'), and comes back in one copy (see arrcoc.engine.cuda_graph); other
        backends run it now."""
        if self.graphs is not None and self.warmed:
            images, query, controls = self._checked(images, query, controls, move=False)
            with torch.inference_mode():
                wait = self.graphs.launch_host(self.table.split(images.shape[0]), images, query, controls)
            return lambda: ModelOutput(*wait())
        out = ModelOutput(*(t.numpy() for t in to_host(self.run(images, query, controls))))
        return lambda: out

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the backend holds (graphs, sessions). Safe to call twice."""

    def bucket_for(self, batch: int) -> int:
        """The bucket a batch of this size is padded to (the largest if it must be split)."""
        return self.table.bucket_for(batch)

    def _controls(self, controls: Tensor | None, batch: int, move: bool = True) -> Tensor:
        if controls is None:
            return self.model.default_controls(batch, self.device)
        return controls.to(self.device, torch.float32) if move else controls

    def _checked(
        self, images: Tensor, query: Tensor, controls: Tensor | None, move: bool = True
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The inputs' shapes checked; with `move`, on the device (query and controls float32)."""
        cfg = self.model.config
        s = cfg.image_size
        if images.dtype != torch.uint8 or images.ndim != 4 or tuple(images.shape[1:]) != (3, s, s):
            raise EngineError(
                f"{self.name} backend expects uint8 images (B, 3, {s}, {s}), got {images.dtype}"
                f" {tuple(images.shape)}; resize with arrcoc.preprocess.to_tensor."
            )
        b = images.shape[0]
        if b == 0:
            raise EngineError("Empty batch.")
        if tuple(query.shape) != (b, cfg.query_dim):
            raise EngineError(f"query embeddings must be ({b}, {cfg.query_dim}), got {tuple(query.shape)}.")
        controls = self._controls(controls, b, move)
        if tuple(controls.shape) != (b, len(CONTROL_FIELDS)):
            raise EngineError(f"controls must be ({b}, {len(CONTROL_FIELDS)}), got {tuple(controls.shape)}.")
        if not move:
            return images, query, controls
        images = images.to(self.device, non_blocking=True)
        query = query.to(self.device, torch.float32, non_blocking=True)
        return images, query, controls


def to_host(outputs: Sequence[Tensor]) -> list[Tensor]:
    """The outputs on the host. From a GPU the copies are queued together (into pinned memory)
    and waited for once, not once per output: eleven round trips per batch were a measurable
    part of an interactive batch's host time."""
    if not outputs or not outputs[0].is_cuda:
        return [t.detach().cpu() for t in outputs]
    host = [t.detach().to("cpu", non_blocking=True) for t in outputs]
    torch.cuda.current_stream(outputs[0].get_device()).synchronize()
    return host


def pad_rows(x: Tensor, bucket: int) -> Tensor:
    """Pad the batch dim to `bucket` by repeating the last row (real data, never zeros)."""
    n = x.shape[0]
    if n == bucket:
        return x
    idx = torch.arange(bucket, device=x.device).clamp_max(n - 1)
    return x.index_select(0, idx)
