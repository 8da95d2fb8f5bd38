"""Inference engine: one interface, one module per backend, one factory."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import EngineError
from ..settings import BACKENDS, DEFAULT_BUCKETS
from .base import Backend


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineError("CUDA was requested but no GPU is visible; use --device cpu.")
    return dev


def exact_float32() -> None:
    """float32 means IEEE float32 on every backend. PyTorch lets cuDNN convolutions use TF32 by
    default (its matmuls not), ONNX Runtime runs with use_tf32=0: eager and compiled would disagree
    with onnx wherever cuDNN picks a TF32 kernel (clip-b16's patch convolution at large buckets;
    docs/model.md, tools/clip_drift.py). Process-wide, read by cuDNN per call."""
    torch.backends.cudnn.allow_tf32 = False  # the legacy switch: sets conv and RNN alike


def create_backend(
    name: str,
    model: nn.Module,
    device: str | torch.device = "auto",
    buckets: tuple[int, ...] = DEFAULT_BUCKETS,
    dtype: torch.dtype = torch.float32,
    cache_dir: Path | None = None,
    **options: object,
) -> Backend:
    """The named backend, not yet warmed up. `options` go to its class (e.g. aot's build=False,
    compiled's dynamic_batch=False)."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        exact_float32()
    if name == "eager":
        from .eager import EagerBackend as cls
    elif name == "compiled":
        from .compiled import CompiledBackend as cls
    elif name == "onnx":
        from .onnx import OnnxBackend as cls
    elif name == "aot":
        from .aot import AotBackend as cls
    else:
        raise EngineError(f"Unknown backend {name!r}; choose one of {', '.join(BACKENDS)}.")
    return cls(model, dev, buckets, dtype, cache_dir, **options)


__all__ = ["Backend", "BACKENDS", "create_backend", "exact_float32", "resolve_device"]
