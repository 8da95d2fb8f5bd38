"""Pixels for the engine: encoded images -> uint8 tensors (3, S, S), decoded once, where the engine is.

Two paths, one per device, so every way of serving a request on a given device gives the same
pixels:
- CPU (and any image the GPU cannot decode): Pillow, with a large JPEG decoded at 1/2, 1/4 or 1/8
  scale (arrcoc.images.decode_image), resized with Pillow's bilinear filter; a batch decodes in the
  calling thread, one image after another.
- GPU with torchvision's nvJPEG: the JPEGs of a batch decode in one call on the device, EXIF
  orientation is applied there, and the resize runs there (bilinear with antialiasing: the same
  filter as Pillow's). Pillow still reads every header first, so the limits and errors are the
  same on both paths. docs/service.md states how far the two paths' maps differ.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from . import nvjpeg
from .errors import ArrcocError, InvalidInputError
from .images import ImageLike, ImageLimits, decode_image, jpeg_complete, jpeg_header, load_image, read_bytes
from .isolation import done, isolated

_PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def to_tensor(img: Image.Image, size: int, resample: str = "bilinear") -> torch.Tensor:
    """RGB PIL image -> uint8 [3, size, size] (bilinear as arr-coc-0-1; CLIP's variants bicubic)."""
    resized = img.resize((size, size), _PIL_FILTERS[resample])
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


@dataclass(frozen=True)
class Pixels:
    """One decoded image: what the engine takes, and what an overlay is drawn on."""

    pixels: torch.Tensor  # uint8 (3, S, S), on the decoding device
    size: tuple[int, int]  # the upright original's (width, height)
    view: torch.Tensor | None  # uint8 (3, h, w): the upright image at most `view_side` on a side, or None


@cache
def gpu_decoder_available() -> bool:
    """torchvision with nvJPEG and a GPU: the GPU path can run."""
    if not torch.cuda.is_available():
        return False
    try:
        from torchvision.io import decode_jpeg  # noqa: F401
    except Exception:  # noqa: BLE001 -- not installed, or built without its image extension
        return False
    return True


def uses_gpu_decoder(device: torch.device) -> bool:
    return device.type == "cuda" and gpu_decoder_available()


# At most this many pixels go through one resize call (its float copy: 4 bytes a channel): a step
# of 12 MP photos resized at once would be a float tensor of gigabytes per call in flight; a step
# of 800x600 photos still goes in one call.
RESIZE_PIXELS = 1 << 26
# At most this many pixels (uint8 RGB: 3 bytes each) decoded by one nvJPEG call: a batch of large
# photos decodes in several calls, its device memory bounded whatever the step's size.
DECODE_PIXELS = 1 << 29


@dataclass(frozen=True)
class Encoded:
    """A JPEG whose header passed every check, left for the GPU to decode with its batch."""

    data: bytes
    orientation: int  # EXIF, applied on the device
    size: tuple[int, int]  # the upright original's (width, height)


def _guarded(step: Callable[..., Any], *args: Any) -> Any:
    """step(*args), or the ArrcocError it raised (an item's own error, said to it alone)."""
    try:
        return step(*args)
    except ArrcocError as e:
        return e


class Decoder:
    """Decodes encoded images for one engine device (see the module docstring) in two steps:
    `start` in the request's own thread (header checks, and on the CPU path the whole decode), and
    `finish` for a batch of what `start` left for the GPU, in one nvJPEG call."""

    def __init__(
        self,
        device: torch.device,
        side: int,
        limits: ImageLimits,
        resample: str = "bilinear",
    ):
        self.device = device
        self.side = side
        self.limits = limits
        self.resample = resample
        self.gpu = uses_gpu_decoder(device)

    def start(self, data: bytes, view_side: int | None = None) -> Pixels | Encoded:
        """Check one image; decode it now unless the GPU will (ImageError for a bad one)."""
        encoded = self._encoded(data) if self.gpu else None
        return encoded if encoded is not None else self._cpu_one(data, view_side)

    def _encoded(self, data: bytes) -> Encoded | None:
        """A JPEG whose header passed every check, for the GPU; None for what the CPU path decodes."""
        ok, orientation, size = _header(data, self.limits)
        return Encoded(data, orientation, size) if ok else None

    def finish(self, encoded: Sequence[Encoded], view_side: int | None = None) -> list[Pixels | ArrcocError]:
        """Decode a batch of started images on the GPU: one nvJPEG call for each run of them of at
        most DECODE_PIXELS (one call for any batch of ordinary photos)."""
        out: list[Pixels | ArrcocError] = []
        run: list[Encoded] = []
        pixels = 0
        for e in encoded:
            if run and pixels + e.size[0] * e.size[1] > DECODE_PIXELS:
                out += self._gpu_many(run, view_side)
                run, pixels = [], 0
            run.append(e)
            pixels += e.size[0] * e.size[1]
        return out + self._gpu_many(run, view_side) if run else out

    def decode(self, images: Sequence[bytes], view_side: int | None = None) -> list[Pixels | ArrcocError]:
        """Both steps for a batch: one Pixels (on this decoder's device) or one ImageError per image."""
        # Pillow's decodes in this thread: a batch job's steps in flight already decode side by side
        # on a GPU, and on a CPU the engine's threads take every core
        out: list[Any] = (
            [_guarded(self._encoded, data) for data in images] if self.gpu else [None] * len(images)
        )
        for i, got in enumerate(out):
            if got is None:
                out[i] = _guarded(self._cpu_one, images[i], view_side)
        pending = [i for i, got in enumerate(out) if isinstance(got, Encoded)]
        for i, got in zip(pending, self.finish([out[i] for i in pending], view_side), strict=True):
            out[i] = got
        return out

    def _cpu_one(self, data: bytes, view_side: int | None) -> Pixels:
        decoded = decode_image(read_bytes(data, self.limits), self.limits, self.side)
        pixels = to_tensor(decoded.image, self.side, self.resample)
        view = None
        if view_side is not None:
            img = decoded.image.copy()
            img.thumbnail((view_side, view_side))
            view = torch.from_numpy(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1).copy())
        if self.device.type == "cuda":
            pixels = pixels.to(self.device, non_blocking=True)
            view = None if view is None else view.to(self.device, non_blocking=True)
        return Pixels(pixels, decoded.size, view)

    def _gpu_many(self, encoded: Sequence[Encoded], view_side: int | None) -> list[Pixels | ArrcocError]:
        """The run in one nvJPEG call; when nvJPEG refuses it (an odd or corrupt JPEG among them),
        each JPEG alone (`isolated`), and one refused alone goes to Pillow, which decodes it or
        says what is wrong."""

        def launch(run: list[Encoded]) -> Callable[[], list[torch.Tensor]]:
            return done(nvjpeg.decode([jpeg_tensor(e.data) for e in run], self.device))

        raw: list[torch.Tensor] = []  # nvJPEG's outputs, held until this stream is done with them
        images: dict[int, torch.Tensor] = {}  # the upright images, by position
        for positions, got in isolated(launch, encoded)():
            if not isinstance(got, Exception):
                raw += got
                images.update(
                    (i, _orient(img, encoded[i].orientation)) for i, img in zip(positions, got, strict=True)
                )
        finished = (
            dict(zip(images, self._finish(list(images.values()), view_side), strict=True)) if images else {}
        )
        if raw and self.device.type == "cuda":
            self._let_go(raw, finished.values())
        return [
            finished[i] if i in finished else _guarded(self._cpu_one, e.data, view_side)
            for i, e in enumerate(encoded)
        ]

    def _let_go(self, raw: list[torch.Tensor], pixels: Iterable[Pixels]) -> None:
        """nvJPEG's outputs come unmarked as used on this thread's stream (arrcoc.nvjpeg): they go
        once the stream is done with them, and a view that is one of them, which the overlays read
        later, is marked as used there (a photo no larger than the overlays needs no resize)."""
        stream = torch.cuda.current_stream(self.device)
        stream.synchronize()
        views = [p.view for p in pixels if p.view is not None]
        if views:
            decoded = {t.data_ptr() for t in raw}
            for view in views:
                if view.data_ptr() in decoded:
                    view.record_stream(stream)

    def _finish(self, images: list[torch.Tensor], view_side: int | None) -> list[Pixels]:
        """Upright decoded images -> Pixels: the engine's pixels and the overlays' views each
        resized by size group (images of one shape in one call)."""
        shapes = [(int(img.shape[1]), int(img.shape[2])) for img in images]
        pixels = resize_groups(images, [(self.side, self.side)] * len(images), self.resample)
        views: list[torch.Tensor | None] = [None] * len(images)
        if view_side is not None:
            sizes = [_view_size(h, w, view_side) for h, w in shapes]
            small = [i for i, (hw, size) in enumerate(zip(shapes, sizes, strict=True)) if hw != size]
            for i, view in zip(
                small, resize_groups([images[i] for i in small], [sizes[i] for i in small]), strict=True
            ):
                views[i] = view
            views = [images[i] if v is None else v for i, v in enumerate(views)]
        return [Pixels(px, (w, h), view) for px, (h, w), view in zip(pixels, shapes, views, strict=True)]


# torch warns, once per process, that a tensor over immutable bytes is not writable; nothing here
# writes to one, so that one warning is taken here, quietly
with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    torch.frombuffer(b"\0", dtype=torch.uint8)


def jpeg_tensor(data: bytes) -> torch.Tensor:
    """A JPEG's bytes as the uint8 tensor nvJPEG reads, over the same memory: no copy of a
    12 MP photo's megabytes, under the GIL, per image."""
    return torch.frombuffer(data, dtype=torch.uint8)


def _view_size(h: int, w: int, side: int) -> tuple[int, int]:
    """An overlay's (height, width): the image at most `side` on a side."""
    scale = min(1.0, side / max(h, w))
    return (h, w) if scale == 1.0 else (max(1, round(h * scale)), max(1, round(w * scale)))


def resize_groups(
    images: Sequence[torch.Tensor],
    sizes: Sequence[tuple[int, int]],
    mode: str = "bilinear",
    max_pixels: int | None = None,
) -> list[torch.Tensor]:
    """Each uint8 (3, h, w) image resized to its (height, width): the images of one shape going to
    one size in one call (at most `max_pixels` source pixels a call: bounded memory for large
    photos), whatever device they are on."""
    limit = RESIZE_PIXELS if max_pixels is None else max_pixels
    out: list[torch.Tensor | None] = [None] * len(images)
    groups: dict[tuple[tuple[int, ...], tuple[int, int]], list[int]] = {}
    for i, (img, size) in enumerate(zip(images, sizes, strict=True)):
        groups.setdefault((tuple(img.shape), tuple(size)), []).append(i)
    for (shape, (height, width)), idx in groups.items():
        per = max(1, limit // (shape[1] * shape[2]))
        for k in range(0, len(idx), per):
            part = idx[k : k + per]
            for i, px in zip(
                part, resize(torch.stack([images[i] for i in part]), height, width, mode), strict=True
            ):
                out[i] = px
    return out  # type: ignore[return-value]


def resize(images: torch.Tensor, height: int, width: int, mode: str = "bilinear") -> torch.Tensor:
    """uint8 (B, 3, h, w) -> uint8 (B, 3, height, width), bilinear or bicubic with antialiasing
    (Pillow's filters)."""
    out = F.interpolate(images.float(), size=(height, width), mode=mode, align_corners=False, antialias=True)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _header(data: bytes, limits: ImageLimits) -> tuple[bool, int, tuple[int, int]]:
    """One read of the header: whether nvJPEG decodes this image as Pillow would (a JPEG in RGB or
    grey, not CMYK, within the pixel limit as it is: a larger one goes to Pillow, which decodes it
    at a fraction of its size), its EXIF orientation and its upright size. What the GPU does not
    take, the CPU path checks and decodes (with the same errors)."""
    data = read_bytes(data, limits)
    head = jpeg_header(data)  # a plain JPEG's header without Pillow's full parse (odd ones: Pillow)
    if head is not None:
        (w, h), orientation = head.size, head.orientation
        ok = head.components in (1, 3) and w * h <= limits.max_pixels
    else:
        try:
            img = Image.open(io.BytesIO(data))
            w, h = img.size
            ok = img.format == "JPEG" and img.mode in ("RGB", "L") and w * h <= limits.max_pixels
            orientation = int(img.getexif().get(0x0112, 1)) if ok else 1
        except Exception:  # noqa: BLE001 -- unreadable: the CPU path says what is wrong
            return False, 1, (0, 0)
    if not ok or not jpeg_complete(data):  # a truncated one: Pillow refuses it, as it should be
        return False, 1, (0, 0)
    if min(w, h) < limits.min_side:
        return False, 1, (0, 0)  # the CPU path refuses it with its message
    return True, orientation, ((h, w) if orientation in (5, 6, 7, 8) else (w, h))


def _orient(img: torch.Tensor, orientation: int) -> torch.Tensor:
    """EXIF orientation 1-8 applied to (3, h, w), as PIL.ImageOps.exif_transpose does."""
    if orientation in (5, 6, 7, 8):
        img = img.transpose(-1, -2)
    flips = {2: (-1,), 3: (-1, -2), 4: (-2,), 6: (-1,), 7: (-1, -2), 8: (-2,)}.get(orientation, ())
    return (img.flip(flips) if flips else img).contiguous()


__all__ = [
    "Decoder",
    "Encoded",
    "Pixels",
    "prepare_batch",
    "resize",
    "resize_groups",
    "to_tensor",
    "uses_gpu_decoder",
]
