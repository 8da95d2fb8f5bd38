"""Batch-job overlays: the relevance map blended over the image, or the foveated view, a step at a
time, where the pixels are.

On a GPU the step's pictures are drawn together as tensors (arrcoc.render.blend_overlays); JPEGs
are encoded there in one batched `encode_jpeg` call and come to the host in one copy, PNGs come to
the host in one copy and Pillow encodes them in the thread pool. torchvision's nvJPEG encoder is
one per process and encodes one picture at a time, waiting for each, so steps from several callers
take turns on it; Pillow instead was slower on both paths (docs/service.md#concurrency). On a CPU worker Pillow draws (arrcoc.render.overlay)
and encodes each picture in a thread pool: its C code lets go of the GIL, so the step's pictures
use every core, where the same tensor operations run several times slower. Both draw the same
picture (to one level of rounding: tests/test_decode.py). The foveated view is tensor work on
either device (arrcoc.foveate.foveate_views: one call per size of picture in the step).
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

import numpy as np
import torch
from PIL import Image

from .foveate import foveate_views
from .render import blend_overlays, overlay
from .settings import DEFAULT_OVERLAY_KIND

JPEG_QUALITY = 90


def encode(views: Sequence[torch.Tensor], maps: np.ndarray, fmt: str, pool: Executor | None = None,
           quality: int = JPEG_QUALITY, kind: str = DEFAULT_OVERLAY_KIND, workers: int = 0) -> list[bytes]:  # fmt: skip
    """One encoded overlay per (view (3, h, w) uint8, map (G, G)); `fmt` jpeg or png, `quality`
    JPEG's. `kind` "relevance": the map (in [0, 1]) blended over the view; "foveated": the view
    foveated under the map (tokens per cell, a budget map). `pool` runs Pillow's work, and on a
    GPU `workers` of its threads help nvJPEG with the JPEGs (encode_jpegs_on_device)."""
    if not len(views):
        return []
    run = (lambda work, items: list(pool.map(work, items))) if pool is not None else (lambda work, items: [work(x) for x in items])
    if kind == "foveated":
        pictures = foveate_views(views, maps)  # tensor work on either device
    elif views[0].is_cuda:
        pictures = blend_overlays(views, maps)
    else:  # a CPU worker: Pillow draws and encodes each picture in the pool
        draw = lambda vm: _save(overlay(Image.fromarray(vm[0].numpy().transpose(1, 2, 0)), vm[1]), fmt, quality)  # noqa: E731
        return run(draw, list(zip(views, maps, strict=True)))
    if fmt == "jpeg" and views[0].is_cuda:
        # torchvision's encoders read the pictures on streams of their own, which do not wait
        # for the one they were drawn on
        torch.cuda.current_stream(views[0].device).synchronize()
        return encode_jpegs_on_device(pictures, quality, pool, workers)
    return run(lambda a: _save(Image.fromarray(a.transpose(1, 2, 0)), fmt, quality), to_host(pictures))


# pictures nvJPEG takes at once from the front of a step's list (each call waits for its bytes)
DEVICE_RUN = 8


def encode_jpegs_on_device(pictures: Sequence[torch.Tensor], quality: int, pool: Executor | None = None,
                           workers: int = 0) -> list[bytes]:  # fmt: skip
    """A step's pictures, (3, h, w) uint8 on a GPU and ready there, as JPEG bytes. torchvision's
    nvJPEG encoder is one per process and encodes one picture at a time, waiting for each, so the
    host's cores help: nvJPEG takes runs of pictures from the front of the list in this thread
    while `workers` of the pool's threads each copy one picture to the host and encode it there (torchvision's
    libjpeg-turbo; both encoders let go of the GIL), from the back, until they meet. The same
    picture either way, to JPEG's rounding."""
    from torchvision.io import encode_jpeg

    if os.environ.get("ARRCOC_AB_HOST_JPEG") == "0":
        workers = 0

    def on_device(run: list[int]) -> list[bytes]:
        return _to_host_bytes(encode_jpeg([pictures[i] for i in run], quality=quality))

    def on_host(i: int) -> bytes:
        return encode_jpeg(pictures[i].cpu(), quality=quality).numpy().tobytes()

    return share(len(pictures), on_device, on_host, pool, workers, DEVICE_RUN)


def share(n: int, front: Callable[[list[int]], list[bytes]], back: Callable[[int], bytes], pool: Executor | None,
          workers: int, run: int) -> list[bytes]:  # fmt: skip
    """Items 0..n-1, each done once, by two kinds of worker that meet in the middle: this thread
    does runs of `run` items from the front with `front`, `workers` tasks in `pool` one item at a
    time from the back with `back`. A task the pool has not started when the front is done is
    dropped; an error in either is raised here."""
    out: list[bytes | None] = [None] * n
    lock = threading.Lock()
    left = [0, n]  # the items not yet taken: [left[0], left[1])

    def from_back() -> int | None:
        with lock:
            if left[1] <= left[0]:
                return None
            left[1] -= 1
            return left[1]

    def helper() -> None:
        while (i := from_back()) is not None:
            out[i] = back(i)

    helpers = [pool.submit(helper) for _ in range(min(workers, n))] if pool is not None else []
    try:
        while True:
            with lock:
                begin, end = left[0], min(left[0] + run, left[1])
                left[0] = end
            if begin >= end:
                break
            for i, data in zip(range(begin, end), front(list(range(begin, end))), strict=True):
                out[i] = data
    finally:
        for h in helpers:
            if not h.cancel():
                h.result()
    return out  # type: ignore[return-value]


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
