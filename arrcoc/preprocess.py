"""Pixels for the engine: checked RGB images -> uint8 tensors [B, 3, S, S]."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from .errors import InvalidInputError
from .images import ImageLike, ImageLimits, load_image


def to_tensor(img: Image.Image, size: int) -> torch.Tensor:
    """RGB PIL image -> uint8 [3, size, size] (bilinear resize, as arr-coc-0-1)."""
    resized = img.resize((size, size), Image.Resampling.BILINEAR)
    out = np.empty((3, size, size), dtype=np.uint8)
    np.copyto(out, np.asarray(resized, dtype=np.uint8).transpose(2, 0, 1))  # HWC -> CHW in one copy
    return torch.from_numpy(out)


def prepare_batch(
    sources: list[ImageLike], size: int = 512, limits: ImageLimits = ImageLimits()
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Images -> (uint8 [B, 3, size, size], original (width, height) of each)."""
    if not sources:
        raise InvalidInputError("No images given.")
    images = [load_image(s, limits) for s in sources]
    batch = torch.stack([to_tensor(im, size) for im in images])
    return batch, [im.size for im in images]
