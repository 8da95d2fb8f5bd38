"""Image input: path / bytes / PIL / array -> a checked, upright 8-bit RGB image (torch-free).

Decoding is guarded (byte and pixel limits, Pillow's decompression-bomb check), EXIF orientation
is applied, every mode Pillow decodes (L, LA, P, RGBA, CMYK, I;16, ...) becomes 8-bit RGB.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import ImageError, InvalidInputError
from .settings import Settings

ImageLike = Union[str, Path, bytes, bytearray, Image.Image, np.ndarray]

# the defaults of the settings' image limits (one home: arrcoc.settings)
DEFAULT_MAX_BYTES: int = Settings.model_fields["max_image_bytes"].default
DEFAULT_MAX_PIXELS: int = Settings.model_fields["max_image_pixels"].default
MIN_SIDE: int = Settings.model_fields["min_image_side"].default


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


def decode(data: bytes, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """Decode bytes to an upright 8-bit RGB PIL image, with clear errors for bad input."""
    with _guarded(limits):
        img = _open(data, limits)
        img.load()
    return to_rgb(img, limits)


def check_header(data: bytes, limits: ImageLimits = ImageLimits()) -> tuple[int, int]:
    """(width, height) from the header alone: the format is one we read and the size is within the
    limits. A submitting side that only forwards the bytes needs no more; whoever decodes them
    still reports a corrupt or truncated body (`decode`)."""
    with _guarded(limits):
        img = _open(data, limits)
    w, h = img.size
    if min(w, h) < limits.min_side:
        raise ImageError(f"The image is {w}x{h}; each side must be at least {limits.min_side} px.")
    return w, h


def _open(data: bytes, limits: ImageLimits) -> Image.Image:
    img = Image.open(io.BytesIO(data))  # reads the header only
    w, h = img.size
    if w * h > limits.max_pixels:
        raise ImageError(
            f"The image is {w}x{h} = {w * h / 1e6:.0f} megapixels; the limit is"
            f" {limits.max_pixels / 1e6:.0f}. Downscale it first."
        )
    return img


@contextlib.contextmanager
def _guarded(limits: ImageLimits) -> Iterator[None]:
    """Pillow's errors as ImageErrors that say what to do; its bomb check at our pixel limit."""
    try:
        with warnings.catch_warnings():
            # Pillow warns between MAX_IMAGE_PIXELS and 2x it; we want an error at our own limit.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            old = Image.MAX_IMAGE_PIXELS
            Image.MAX_IMAGE_PIXELS = limits.max_pixels
            try:
                yield
            finally:
                Image.MAX_IMAGE_PIXELS = old
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(
            f"The image is too large to decode safely ({e}). Downscale it first."
        ) from e
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
        arr = np.asarray(img, dtype=np.float64)
        peak = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        arr = np.clip(arr / peak * 255.0 + 0.5, 0, 255).astype(np.uint8)
        img = Image.fromarray(arr, mode="L")
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        img = Image.alpha_composite(background, rgba)
    return img.convert("RGB")


def load_image(source: ImageLike, limits: ImageLimits = ImageLimits()) -> Image.Image:
    """Any supported input -> upright 8-bit RGB PIL image."""
    if isinstance(source, Image.Image):
        w, h = source.size
        if w * h > limits.max_pixels:
            raise ImageError(f"The image is {w}x{h}; the limit is {limits.max_pixels} pixels.")
        return to_rgb(source, limits)
    if isinstance(source, np.ndarray):
        return to_rgb(_array_to_pil(source), limits)
    if isinstance(source, (str, Path, bytes, bytearray)):
        return decode(read_bytes(source, limits), limits)
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
