"""Batch-job overlays: the relevance map blended over the image, a step at a time, where the pixels are.

The pictures of a step are drawn together as tensors (arrcoc.render.blend_overlays), on the GPU
when the engine is there. On a GPU with torchvision, JPEGs are encoded there in one batched
`encode_jpeg` call and come to the host in one copy; otherwise (a CPU worker, or PNG) the pictures
come to the host in one copy and Pillow encodes them in a thread pool (it lets go of the GIL).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np
import torch
from PIL import Image

from .render import blend_overlays

JPEG_QUALITY = 90


def encode(views: Sequence[torch.Tensor], maps: np.ndarray, fmt: str, pool: Executor | None = None,
           quality: int = JPEG_QUALITY) -> list[bytes]:  # fmt: skip
    """One encoded overlay per (view (3, h, w) uint8, map (G, G) in [0, 1]); `fmt` jpeg or png,
    `quality` JPEG's."""
    if not len(views):
        return []
    pictures = blend_overlays(views, maps)
    if pictures[0].is_cuda and fmt == "jpeg":
        from torchvision.io import encode_jpeg

        return _to_host_bytes(encode_jpeg(pictures, quality=quality))
    hosts = to_host(pictures)
    work = lambda a: _save(Image.fromarray(a.transpose(1, 2, 0)), fmt, quality)  # noqa: E731
    return list(pool.map(work, hosts)) if pool is not None else [work(a) for a in hosts]


def to_host(pictures: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """(3, h, w) uint8 tensors -> numpy arrays on the host, in one copy for the step."""
    if not pictures[0].is_cuda:
        return [p.numpy() for p in pictures]
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
