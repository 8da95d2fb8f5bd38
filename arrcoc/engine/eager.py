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

    def run(self, images, query, controls=None):
        if not self.warmed:  # nothing to prepare: the reference runs without an explicit warmup
            self.warmup()
        return super().run(images, query, controls)

    @torch.inference_mode()
    def _run_bucket(self, bucket: int, images: Tensor, query: Tensor, controls: Tensor) -> tuple[Tensor, ...]:
        return self._fn(images, query, controls)  # no padding: eager takes any batch size
