"""Batch-job overlays: the relevance map blended over the image, or the foveated view, a step at a
time, where the pixels are.

On a GPU the step's pictures are drawn together as tensors (arrcoc.render.blend_overlays) and come
to the host in one copy, where Pillow encodes each (JPEG or PNG), as on a CPU worker. On a CPU worker Pillow draws (arrcoc.render.overlay)
and encodes each picture, where the same tensor operations run several times slower. Both draw the
same picture (to one level of rounding: tests/test_decode.py). The foveated view is tensor work on
either device (arrcoc.foveate.foveate_views: one call per size of picture in the step). All of it
runs in the calling step thread (docs/service.md#concurrency).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from .foveate import foveate_views
from .render import blend_overlays, overlay
from .settings import DEFAULT_OVERLAY_KIND

JPEG_QUALITY = 90


def encode(
    views: Sequence[torch.Tensor],
    maps: np.ndarray,
    fmt: str,
    quality: int = JPEG_QUALITY,
    kind: str = DEFAULT_OVERLAY_KIND,
) -> list[bytes]:
    """One encoded overlay per (view (3, h, w) uint8, map (G, G)); `fmt` jpeg or png, `quality`
    JPEG's. `kind` "relevance": the map (in [0, 1]) blended over the view; "foveated": the view
    foveated under the map (tokens per cell, a budget map)."""
    if not len(views):
        return []
    if kind == "foveated":
        pictures = foveate_views(views, maps)  # tensor work on either device
    elif views[0].is_cuda:
        pictures = blend_overlays(views, maps)
    else:  # a CPU worker: Pillow draws and encodes each picture
        return [
            _save(overlay(Image.fromarray(v.numpy().transpose(1, 2, 0)), m), fmt, quality)
            for v, m in zip(views, maps, strict=True)
        ]
    # drawn on the device, encoded on the host: Pillow encodes each picture without the GIL, so
    # steps in flight encode side by side, where torchvision's nvJPEG encoder (one per process)
    # takes one picture at a time and waits for each on a device busy with the other steps
    return [_save(Image.fromarray(a), fmt, quality) for a in to_host(pictures)]


def to_host(pictures: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """(3, h, w) uint8 tensors on the device -> (h, w, 3) numpy arrays on the host (Pillow's
    layout, laid out on the device), in one copy for the step."""
    flat = torch.cat([p.permute(1, 2, 0).reshape(-1) for p in pictures]).cpu().numpy()
    shapes = [(int(p.shape[1]), int(p.shape[2]), int(p.shape[0])) for p in pictures]
    ends = np.cumsum([p.numel() for p in pictures])
    return [
        flat[end - p.numel() : end].reshape(hwc) for p, end, hwc in zip(pictures, ends, shapes, strict=True)
    ]


def _save(picture: Image.Image, fmt: str, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        picture.save(buf, "JPEG", quality=quality)
    else:
        picture.save(buf, "PNG", compress_level=1)  # level 1: much quicker than the default, a little larger
    return buf.getvalue()
