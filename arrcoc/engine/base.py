"""The backend interface every engine backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

import torch
from torch import Tensor, nn

from ..model import ModelOutput


class Backend(ABC):
    """warmup() once, then run() many times, then close().

    run() takes uint8 images (B, 3, S, S), query embeddings (B, Dq) and controls (B, 5) on any
    device, and returns a ModelOutput on the backend's device that the caller owns (never a
    view of a buffer the next call overwrites).
    """

    name: str = "?"

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64),
        dtype: torch.dtype = torch.float32,
        cache_dir: Path | None = None,
    ):
        self.model = model.to(device).eval()
        self.device = device
        self.buckets = tuple(sorted(buckets))
        self.dtype = dtype
        self.cache_dir = cache_dir
        self.warmed = False

    @abstractmethod
    def warmup(self) -> None: ...

    @abstractmethod
    def run(self, images: Tensor, query: Tensor, controls: Tensor | None = None) -> ModelOutput: ...

    def close(self) -> None:
        """Release what the backend holds (graphs, sessions). Safe to call twice."""

    def bucket_for(self, batch: int) -> int:
        """The bucket a batch of this size is padded to (the largest if it must be split)."""
        for b in self.buckets:
            if b >= batch:
                return b
        return self.buckets[-1]

    def _controls(self, controls: Tensor | None, batch: int) -> Tensor:
        if controls is None:
            return self.model.default_controls(batch, self.device)
        return controls.to(self.device, torch.float32)
