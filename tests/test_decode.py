"""Decoding for the engine (arrcoc/preprocess.py, arrcoc/images.py): large photos reduced while
decoding, EXIF orientation on both paths, the GPU path (nvJPEG) against Pillow where a GPU runs."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from arrcoc.errors import ImageError
from arrcoc.images import ImageLimits, decode_image
from arrcoc.preprocess import Decoder, _orient, to_tensor, uses_gpu_decoder

EXAMPLES = Path(__file__).resolve().parent.parent / "arrcoc" / "examples"


def jpeg(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def test_a_phone_sized_jpeg_is_reduced_while_decoding_not_refused() -> None:
    """48 MP is over the 40 MP limit, but the model needs 512 px: the JPEG decodes at 1/8 scale."""
    big = Image.open(EXAMPLES / "coffee.jpg").resize((8000, 6000))
    data = jpeg(big)
    got = decode_image(data, ImageLimits(), side=512)
    assert got.size == (8000, 6000)  # heatmaps map back to the original
    assert got.image.size == (1000, 750)  # decoded at 1/8: 3 bytes a pixel of 0.75 MP, not of 48 MP
    with pytest.raises(ImageError, match="40 megapixels"):
        decode_image(data, ImageLimits())  # decoded in full (e.g. for display) it is over the limit


def test_a_png_over_the_limit_is_refused_with_the_settings_number() -> None:
    buf = io.BytesIO()
    Image.new("L", (7000, 6000)).save(buf, "PNG")
    with pytest.raises(ImageError, match="the limit is 40 megapixels decoded"):
        decode_image(buf.getvalue(), ImageLimits(), side=512)


def test_sixteen_bit_grey_becomes_8_bit_as_before() -> None:
    arr = (np.arange(64 * 48, dtype=np.uint16).reshape(48, 64) * 21).astype(np.uint16)
    buf = io.BytesIO()
    Image.fromarray(arr, mode="I;16").save(buf, "PNG")
    got = np.asarray(decode_image(buf.getvalue()).image)[..., 0]
    expected = np.clip(arr / 65535.0 * 255.0 + 0.5, 0, 255).astype(np.uint8)
    assert np.abs(got.astype(int) - expected).max() <= 1


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_on_the_device_matches_pillow(orientation: int) -> None:
    """The GPU path turns the decoded tensor upright itself: the same picture as exif_transpose."""
    rng = np.random.default_rng(orientation)
    img = Image.fromarray(rng.integers(0, 255, (5, 7, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = orientation
    img.info["exif"] = exif.tobytes()
    img.getexif()[0x0112] = orientation
    upright = np.asarray(ImageOps.exif_transpose(img)).transpose(2, 0, 1)
    ours = _orient(torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()), orientation)
    assert np.array_equal(ours.numpy(), upright)


def test_the_cpu_decoder_gives_the_pipelines_pixels_and_per_item_errors() -> None:
    data = (EXAMPLES / "chelsea.jpg").read_bytes()
    dec = Decoder(torch.device("cpu"), 512, ImageLimits())
    try:
        good, bad = dec.decode([data, b"\xff\xd8 not a jpeg"], view_side=256)
    finally:
        dec.close()
    assert isinstance(bad, ImageError)
    assert torch.equal(good.pixels, to_tensor(decode_image(data).image, 512))
    assert good.size == Image.open(io.BytesIO(data)).size and max(good.view.shape[1:]) == 256


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not uses_gpu_decoder(torch.device("cuda")),
                    reason="needs a GPU and torchvision's nvJPEG")  # fmt: skip
def test_gpu_decoding_is_close_to_pillow_and_upright() -> None:
    photo = Image.open(EXAMPLES / "coffee.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: upright is 90 degrees clockwise
    rotated = jpeg(photo, exif=exif.tobytes())
    phone = jpeg(photo.resize((8000, 6000)))  # over the pixel limit: the CPU path reduces it while decoding
    images = [(EXAMPLES / n).read_bytes() for n in ("coffee.jpg", "chelsea.jpg")] + [rotated, b"\xff\xd8 broken", phone]
    gpu = Decoder(torch.device("cuda"), 512, ImageLimits())
    cpu = Decoder(torch.device("cpu"), 512, ImageLimits())
    try:
        g, c = gpu.decode(images, view_side=300), cpu.decode(images, view_side=300)
    finally:
        gpu.close(), cpu.close()
    assert isinstance(g[3], ImageError) and isinstance(c[3], ImageError)
    for a, b in zip(g[:3], c[:3], strict=True):
        assert a.pixels.is_cuda and a.size == b.size
        assert (a.pixels.cpu().int() - b.pixels.int()).abs().float().mean() < 2.0  # a level here and there
    assert g[2].size == (photo.height, photo.width)  # upright
    assert g[4].size == (8000, 6000) and torch.equal(g[4].pixels.cpu(), c[4].pixels)
