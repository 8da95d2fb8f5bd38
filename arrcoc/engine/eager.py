"""Eager PyTorch: the reference every other backend is checked against."""

from __future__ import annotations

import torch
from torch import Tensor

from ..model import ModelOutput
from .base import Backend


class EagerBackend(Backend):
    name = "eager"

    def warmup(self) -> None:
        self.warmed = True

    @torch.inference_mode()
    def run(self, images: Tensor, query: Tensor, controls: Tensor | None = None) -> ModelOutput:
        images = images.to(self.device, non_blocking=True)
        query = query.to(self.device, torch.float32, non_blocking=True)
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            out = self.model(images, query, self._controls(controls, images.shape[0]))
        return ModelOutput(*(t.float() if t.is_floating_point() else t for t in out))
