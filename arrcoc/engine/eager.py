"""Eager PyTorch: the reference every other backend is checked against."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import Backend, ForwardFn


class EagerBackend(Backend):
    name = "eager"

    def warmup(self) -> None:
        self._fn = ForwardFn(self.model, self.device.type, self.dtype)
        self.warmed = True

    @torch.inference_mode()
    def _run_bucket(self, bucket: int, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        return self._fn(images, query, controls)  # no padding: eager takes any batch size
