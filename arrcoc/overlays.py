"""Batch-job overlays: the relevance map blended over the image, encoded, where the pixels are.

On a GPU (torchvision's nvJPEG) the colour map, the blend and the JPEG encoding of a whole batch
run on the device; elsewhere (and for PNG, which the GPU does not encode) arrcoc.render.overlay
draws each with Pillow in a thread pool. Both draw the same picture: the map's cells coloured
with the same colour table, crisp (nearest), blended at the same alpha.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .render import _LUT, OVERLAY_ALPHA, overlay

JPEG_QUALITY = 90


@cache
def _lut(device: torch.device) -> torch.Tensor:
    return torch.from_numpy(_LUT.astype(np.float32)).to(device)  # (256, 3)


def encode(views: Sequence[torch.Tensor], maps: Sequence[np.ndarray], fmt: str,
           pool: ThreadPoolExecutor | None = None, quality: int = JPEG_QUALITY) -> list[bytes]:  # fmt: skip
    """One encoded overlay per (view (3, h, w) uint8, map (G, G) in [0, 1]); `quality`: JPEG's."""
    if not views:
        return []
    if views[0].is_cuda:
        blended = _blend_gpu(views, maps)
        if fmt == "jpeg" and JPEG_ON_GPU:
            from torchvision.io import encode_jpeg

            return _to_host_bytes(encode_jpeg(blended, quality=quality))
        hosts = [t.cpu().numpy().transpose(1, 2, 0) for t in blended]
        work = lambda a: _save(Image.fromarray(a), fmt, quality)  # noqa: E731
        return list(pool.map(work, hosts)) if pool else [work(a) for a in hosts]
    work = lambda vm: _save(overlay(Image.fromarray(vm[0].numpy().transpose(1, 2, 0)), vm[1]), fmt, quality)  # noqa: E731
    return list(pool.map(work, zip(views, maps, strict=True))) if pool else [work(vm) for vm in zip(views, maps, strict=True)]


def _to_host_bytes(encoded: Sequence[torch.Tensor]) -> list[bytes]:
    """Encoded pictures on the device -> bytes: one copy to the host for the batch, not one copy
    and wait per picture (the lengths are known on the host)."""
    flat = torch.cat(list(encoded)).cpu().numpy()
    ends = np.cumsum([t.numel() for t in encoded])
    return [flat[end - t.numel() : end].tobytes() for t, end in zip(encoded, ends, strict=True)]


# nvJPEG encodes one picture after another on a CUDA worker (torchvision's encode_jpeg): measured
# against Pillow in the render pool by tools/batch_probe.py
JPEG_ON_GPU = True


def _save(picture: Image.Image, fmt: str, quality: int = JPEG_QUALITY) -> bytes:
    buf = io.BytesIO()
    if fmt == "jpeg":
        picture.save(buf, "JPEG", quality=quality)
    else:
        picture.save(buf, "PNG", compress_level=1)  # level 1: a quarter of the default's time, ~10% larger
    return buf.getvalue()


def _blend_gpu(views: Sequence[torch.Tensor], maps: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """The overlays' pixels, (3, h, w) uint8 on the views' device: each map's cells coloured
    through the colour table, upsampled crisp (nearest) and blended over its view."""
    device = views[0].device
    lut = _lut(device)
    grids = torch.from_numpy(np.stack([np.asarray(m, dtype=np.float32) for m in maps])).to(device)
    heat = lut[(grids * 255.0 + 0.5).clamp_(0, 255).long()].permute(0, 3, 1, 2)  # (B, 3, G, G)
    blended: list[torch.Tensor | None] = [None] * len(views)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, view in enumerate(views):
        by_shape.setdefault(tuple(view.shape), []).append(i)
    for shape, idx in by_shape.items():  # views of one shape are blended in one call
        up = F.interpolate(heat[idx], size=shape[1:], mode="nearest-exact")
        mix = torch.stack([views[i] for i in idx]).float() * (1.0 - OVERLAY_ALPHA) + up * OVERLAY_ALPHA
        for i, picture in zip(idx, mix.round_().clamp_(0, 255).to(torch.uint8), strict=True):
            blended[i] = picture
    return blended  # type: ignore[return-value]
