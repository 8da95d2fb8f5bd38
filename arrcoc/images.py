"""Image input: path / bytes / PIL / array -> a checked, upright 8-bit RGB image (torch-free).

Decoding is guarded (byte and pixel limits, Pillow's decompression-bomb check), EXIF orientation
is applied, every mode Pillow decodes (L, LA, P, RGBA, CMYK, I;16, ...) becomes 8-bit RGB.
"""

from __future__ import annotations

import contextlib
import io
import re
import struct
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import ImageError, InvalidInputError
from .settings import LimitSettings
from .tuning import LARGE_DECODE_PIXELS, LARGE_DECODES

ImageLike = Union[str, Path, bytes, bytearray, Image.Image, np.ndarray]

# the defaults of the settings' image limits (one home: arrcoc.settings)
DEFAULT_MAX_BYTES: int = LimitSettings.model_fields["max_image_bytes"].default
DEFAULT_MAX_PIXELS: int = LimitSettings.model_fields["max_image_pixels"].default
MIN_SIDE: int = LimitSettings.model_fields["min_image_side"].default


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_pixels: int = DEFAULT_MAX_PIXELS
    min_side: int = MIN_SIDE


def read_bytes(source: str | Path | bytes | bytearray, limits: ImageLimits = ImageLimits()) -> bytes:
    """Bytes of an image file, refusing what is too large before reading it whole."""
    if isinstance(source, (bytes, bytearray)):
        data = bytes(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise ImageError(f"No image file at {path}: check the path.")
        size = path.stat().st_size
        if size > limits.max_bytes:
            raise ImageError(
                f"{path.name} is {size / 1e6:.1f} MB; the limit is {limits.max_bytes / 1e6:.0f} MB."
                " Resize or recompress it."
            )
        data = path.read_bytes()
    if not data:
        raise ImageError("The image is empty (0 bytes).")
    if len(data) > limits.max_bytes:
        raise ImageError(
            f"The image is {len(data) / 1e6:.1f} MB; the limit is {limits.max_bytes / 1e6:.0f} MB."
        )
    return data


@dataclass(frozen=True)
class Decoded:
    """An image as the model needs it: upright 8-bit RGB, possibly reduced while decoding, and the
    size of the upright original (heatmaps are drawn back at that size)."""

    image: Image.Image
    size: tuple[int, int]


# Pillow refuses to open above 2x its own MAX_IMAGE_PIXELS (~179 MP): past that, even the header
# of a JPEG we could decode at 1/8 scale is refused as a likely decompression bomb.
_BOMB_PIXELS = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else 178_956_970
_large_decodes = threading.BoundedSemaphore(LARGE_DECODES)  # decodes over LARGE_DECODE_PIXELS
# The pixel limits are ours (checked on the declared size before any decode); Pillow's own bomb
# warning would only repeat that check.
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)


def decode(data: bytes, limits: ImageLimits = ImageLimits(), side: int | None = None) -> Image.Image:
    """Decode bytes to an upright 8-bit RGB PIL image, with clear errors for bad input (see
    decode_image)."""
    return decode_image(data, limits, side).image


def decode_image(data: bytes, limits: ImageLimits = ImageLimits(), side: int | None = None) -> Decoded:
    """Decode bytes, checking every limit on the declared size first.

    side: the size the caller will resize to (the model's S). A JPEG larger than twice that is
    decoded at 1/2, 1/4 or 1/8 scale while it is read (Pillow's draft: the DCT does the scaling,
    almost for free), so a 12 MP photo costs a few ms and a phone's 48 MP photo is accepted: only
    the reduced image must fit the pixel limit. Without `side`, or for other formats, the image
    decodes at full size and must fit the limit itself.
    """
    with _guarded(limits):
        img = Image.open(io.BytesIO(data))  # reads the header only
        declared = img.size
        if side is not None and img.format == "JPEG":
            img.draft(img.mode if img.mode in ("RGB", "L") else None, (side, side))
        _check_pixels(img, declared, limits)
        big = img.size[0] * img.size[1] > LARGE_DECODE_PIXELS
        with _large_decodes if big else contextlib.nullcontext():
            img.load()
            if side is not None:
                img = _reduced(img, side)
            upright = to_rgb(img, limits)
    return Decoded(upright, _upright_size(img, declared))


def _reduced(img: Image.Image, side: int) -> Image.Image:
    """An image decoded much larger than the model needs (a format without draft), reduced by an
    integer factor (a box average) to at least twice `side`: the conversions and the resize that
    follow then touch a few MB, not a whole 40 MP frame (or its 16-bit original)."""
    factor = min(img.size) // (2 * side)
    if factor < 2:
        return img
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        img = Image.fromarray(_to_uint8(img), mode="L")  # 8 bits first: reduce takes no 16-bit modes
    try:
        return img.reduce(factor)
    except ValueError:  # a mode reduce does not take ("1", "P", ...)
        return img.convert("RGBA" if img.mode in ("PA", "LA", "P") else "RGB").reduce(factor)


def _check_pixels(img: Image.Image, declared: tuple[int, int], limits: ImageLimits) -> None:
    w, h = img.size  # after any draft: what will be decoded
    dw, dh = declared
    if dw * dh > _BOMB_PIXELS or w * h > limits.max_pixels:
        reducible = (
            " (JPEG photos are reduced while decoding; other formats are not)" if (w, h) == declared else ""
        )
        raise ImageError(
            f"The image is {dw}x{dh} = {dw * dh / 1e6:.0f} megapixels; the limit is"
            f" {limits.max_pixels / 1e6:.0f} megapixels decoded{reducible}. Downscale it first."
        )


def _upright_size(img: Image.Image, declared: tuple[int, int]) -> tuple[int, int]:
    """The original's (width, height) after its EXIF orientation (5-8 swap the sides)."""
    with contextlib.suppress(Exception):
        if img.getexif().get(0x0112, 1) in (5, 6, 7, 8):
            return declared[1], declared[0]
    return declared


@dataclass(frozen=True)
class JpegHeader:
    """What the frame header of a plain JPEG says, read without Pillow (see jpeg_header)."""

    size: tuple[int, int]  # (width, height) as stored, before EXIF orientation
    components: int  # 1 grey, 3 colour (Pillow's "RGB"), 4 CMYK
    orientation: int  # EXIF orientation 1-8 (1 without EXIF)


# A segment's start (0xFF, its marker, the length that follows) and a frame header's first fields
# (precision, height, width, components), big-endian as JPEG stores them.
_SEGMENT = struct.Struct(">BBH")
_FRAME = struct.Struct(">BHHB")
# Frames Pillow and nvJPEG both decode: baseline, extended and progressive, Huffman-coded, 8 bits.
_PLAIN_SOF = frozenset((0xC0, 0xC1, 0xC2))
# Markers with no length field (TEM, RSTn) and the rest of the SOF family (lossless, arithmetic):
# either is unusual before the frame header, so the caller asks Pillow.
_ODD_MARKERS = frozenset(
    (0x01, *range(0xD0, 0xD8), 0xC3, *range(0xC5, 0xC8), *range(0xC9, 0xCC), *range(0xCD, 0xD0))
)


def jpeg_header(data: bytes | memoryview) -> JpegHeader | None:
    """A JPEG's frame header found by walking its markers up to the frame, EXIF orientation read
    by Pillow's own Exif parser from the APP1 block alone; Pillow's full header parse also reads
    every quantisation and Huffman table, in Python, for each request on the GPU path. None for
    anything but a plain 8-bit JPEG, or anything unusual: the caller asks Pillow then, so every
    odd file gets Pillow's answer and error."""
    if data[:3] != b"\xff\xd8\xff":
        return None
    pos, end, orientation = 2, len(data), 1
    exif_seen = False
    while pos + 4 <= end:
        ff, marker, length = _SEGMENT.unpack_from(data, pos)
        if ff != 0xFF:
            return None
        if marker == 0xFF:  # a fill byte before the marker
            pos += 1
            continue
        if marker in _ODD_MARKERS or marker in (0xD8, 0xD9, 0xDA):  # no frame before these: odd
            return None
        if length < 2 or pos + 2 + length > end:
            return None
        # the segment's body is data[pos + 4 : pos + 2 + length]: read in place, sliced only for EXIF
        if marker == 0xE1 and not exif_seen and length >= 8 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            exif_seen = True  # Pillow keeps the first
            exif = Image.Exif()
            try:
                # bytes: the header may be a view of a larger buffer
                exif.load(bytes(data[pos + 4 : pos + 2 + length]))
                orientation = int(exif.get(0x0112, 1))
            except Exception:  # noqa: BLE001 -- an EXIF block Pillow cannot read: Pillow decides
                return None
            if orientation not in range(1, 9):
                return None
        elif marker in _PLAIN_SOF:
            if length < 8:
                return None
            precision, height, width, components = _FRAME.unpack_from(data, pos + 4)
            if precision != 8 or not width or not height or components not in (1, 3, 4):
                return None
            return JpegHeader((width, height), components, orientation)
        pos += 2 + length
    return None


def jpeg_complete(data: bytes) -> bool:
    """Whether a JPEG goes on to an end-of-image marker (EOI) after its first scan begins, as Pillow
    needs to decode it: one cut short anywhere (in a scan, between a progressive file's scans,
    just before its EOI) Pillow refuses as truncated, where nvJPEG fills the rest grey and calls it
    decoded, so only a complete one goes to nvJPEG. The scan is found by walking the segments, so an
    EXIF thumbnail's own markers are skipped; inside a scan a 0xFF byte is always followed by 0x00
    or a restart marker, so the first FF D9 after it is the image's end."""
    if data[:2] != b"\xff\xd8":
        return False
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        if marker == 0xFF:  # a fill byte before the marker
            pos += 1
            continue
        if marker in _ODD_MARKERS or marker in (0xD8, 0xD9):  # unusual before a scan: Pillow decides
            return False
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if length < 2:
            return False
        if marker == 0xDA:
            return data.endswith(b"\xff\xd9") or data.find(b"\xff\xd9", pos + 2 + length) >= 0
        pos += 2 + length
    return False


def draft_size(size: tuple[int, int], side: int) -> tuple[int, int]:
    """The size Pillow's draft decodes a JPEG of `size` (width, height) at for `side`: reduced by
    the largest of 8, 4, 2 (or 1) that both sides hold `side` times over, rounded up, as
    `JpegImageFile.draft` does (tests/test_images.py compares the two)."""
    w, h = size
    most = min(w // side, h // side)
    scale = next((s for s in (8, 4, 2) if most >= s), 1)
    return -(-w // scale), -(-h // scale)


def check_header(
    data: bytes, limits: ImageLimits = ImageLimits(), side: int | None = None
) -> tuple[int, int]:
    """(width, height) from the header alone: the format is one we read and the size is within the
    limits (as `decode_image` with the same `side` checks them). A submitting side that only
    forwards the bytes needs no more; whoever decodes them still reports a corrupt or truncated
    body."""
    with _guarded(limits):
        img = Image.open(io.BytesIO(data))
        declared = img.size
        if side is not None and img.format == "JPEG":
            img.draft(img.mode if img.mode in ("RGB", "L") else None, (side, side))
        _check_pixels(img, declared, limits)
    w, h = declared
    if min(w, h) < limits.min_side:
        raise ImageError(f"The image is {w}x{h}; each side must be at least {limits.min_side} px.")
    return w, h


@contextlib.contextmanager
def _guarded(limits: ImageLimits | None = None) -> Iterator[None]:
    """Pillow's errors as ImageErrors that say what to do (a size past Pillow's own bomb limit
    quoted against ours, `limits`)."""
    try:
        yield
    except ImageError:
        raise
    except Image.DecompressionBombError as e:
        found = re.search(r"\((\d+) pixels\)", str(e))
        size = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
        limit = (limits or ImageLimits()).max_pixels
        raise ImageError(f"The image has {size}; the limit is {limit:,} pixels. Downscale it first.") from e
    except UnidentifiedImageError as e:
        raise ImageError(
            "This is not an image format we can read (or the file is corrupt)."
            " Use PNG, JPEG, WebP, GIF, BMP or TIFF."
        ) from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(f"The image file is corrupt or truncated: {e}") from e


def to_rgb(img: Image.Image, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """Upright 8-bit RGB: EXIF orientation applied, alpha composited on white, 16-bit scaled."""
    img = ImageOps.exif_transpose(img)
    w, h = img.size
    if min(w, h) < limits.min_side:
        raise ImageError(f"The image is {w}x{h}; each side must be at least {limits.min_side} px.")
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        img = Image.fromarray(_to_uint8(img), mode="L")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, rgba)
    return img.convert("RGB")


def _to_uint8(img: Image.Image, rows: int = 256) -> np.ndarray:
    """A 16-bit or 32-bit grey image as 8 bits, a band of rows at a time: never a float64 copy of
    the whole image (6300x6300 at 8 bytes a pixel was 320 MB)."""
    arr = np.asarray(img)
    if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        raise ImageError(
            "The image's pixels include NaN (not-a-number) or infinite values (a floating-point TIFF);"
            " export it with finite values, e.g. as 8-bit or 16-bit."
        )
    peak = 65535 if img.mode.startswith("I;16") or int(arr.max()) > 255 else 255
    out = np.empty(arr.shape, dtype=np.uint8)
    for r in range(0, arr.shape[0], rows):
        band = np.clip(np.nan_to_num(arr[r : r + rows].astype(np.float32)), 0, peak)
        out[r : r + rows] = (band * (255.0 / peak) + 0.5).astype(np.uint8)
    return out


def load_image(
    source: ImageLike, limits: ImageLimits = ImageLimits(), side: int | None = None
) -> Image.Image:
    """Any supported input -> upright 8-bit RGB PIL image (see decode_image for `side`)."""
    return load_decoded(source, limits, side).image


def load_decoded(source: ImageLike, limits: ImageLimits = ImageLimits(), side: int | None = None) -> Decoded:
    """Any supported input -> Decoded (the image, and the upright original's size)."""
    if isinstance(source, Image.Image):
        w, h = source.size
        if w * h > limits.max_pixels:
            raise ImageError(
                f"The image is {w}x{h}; the limit is {limits.max_pixels:,} pixels. Downscale it first."
            )
        img = to_rgb(source, limits)
        return Decoded(img, img.size)
    if isinstance(source, np.ndarray):
        img = to_rgb(_array_to_pil(source), limits)
        return Decoded(img, img.size)
    if isinstance(source, (str, Path, bytes, bytearray)):
        return decode_image(read_bytes(source, limits), limits, side)
    raise InvalidInputError(
        f"Expected an image path, bytes, PIL image or numpy array, got {type(source).__name__}."
    )


def _array_to_pil(arr: np.ndarray) -> Image.Image:
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3, 4):
        raise ImageError(f"An image array must be HxW, HxWx3 or HxWx4; got shape {arr.shape}.")
    if arr.dtype != np.uint8:
        if np.issubdtype(arr.dtype, np.floating) and arr.size and float(np.nanmax(arr)) <= 1.0:
            arr = np.nan_to_num(arr) * 255.0
        arr = np.clip(np.nan_to_num(arr.astype(np.float64)), 0, 255).astype(np.uint8)
    if arr.shape[2] == 1:
        return Image.fromarray(arr[..., 0], mode="L")
    return Image.fromarray(arr, mode="RGB" if arr.shape[2] == 3 else "RGBA")
