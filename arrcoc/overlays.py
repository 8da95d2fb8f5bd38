"""Batch-job overlays: the relevance map blended over the image, or the foveated view, a step at a
time, where the pixels are.

On a GPU the step's pictures are drawn together as tensors (arrcoc.render.blend_overlays); JPEGs
are encoded there in one batched `encode_jpeg` call and come to the host in one copy, PNGs come to
the host in one copy and Pillow encodes them. On a CPU worker Pillow draws (arrcoc.render.overlay)
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

from . import nvjpeg
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
    if fmt == "jpeg" and views[0].is_cuda:
        # torchvision's encoder reads the pictures on a stream of its own, which does not wait
        # for the one they were drawn on
        torch.cuda.current_stream(views[0].device).synchronize()
        return _to_host_bytes(nvjpeg.encode(pictures, quality))
    return [_save(Image.fromarray(a.transpose(1, 2, 0)), fmt, quality) for a in to_host(pictures)]


def to_host(pictures: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """(3, h, w) uint8 tensors on the device -> numpy arrays on the host, in one copy for the step."""
    flat = torch.cat([p.reshape(-1) for p in pictures]).cpu().numpy()
    ends = np.cumsum([p.numel() for p in pictures])
    return [flat[end - p.numel() : end].reshape(p.shape) for p, end in zip(pictures, ends, strict=True)]


def _to_host_bytes(encoded: Sequence[torch.Tensor]) -> list[bytes]:
    """Encoded pictures on the device -> bytes: one copy to the host for the step (the lengths are
    known on the host)."""
    flat = torch.cat(list(encoded)).cpu().numpy()
    ends = np.cumsum([t.numel() for t in encoded])
    return [flat[end - t.numel() : end].tobytes() for t, end in zip(encoded, ends, strict=True)]


def _save(picture: Image.Image, fmt: str, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        picture.save(buf, "JPEG", quality=quality)
    else:
        picture.save(buf, "PNG", compress_level=1)  # level 1: much quicker than the default, a little larger
    return buf.getvalue()
