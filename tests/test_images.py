"""Image input: every mode becomes upright 8-bit RGB; bad input fails with a clear ImageError."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from arrcoc.errors import ImageError, InvalidInputError
from arrcoc.images import ImageLimits, load_image
from arrcoc.preprocess import prepare_batch


def encode(img: Image.Image, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


def test_path_bytes_pil_and_array_agree(examples_dir: Path) -> None:
    path = examples_dir / "coffee.jpg"
    from_path = load_image(path)
    assert from_path.mode == "RGB" and from_path.size == (600, 400)
    for source in (str(path), path.read_bytes(), Image.open(path), np.asarray(from_path)):
        assert np.array_equal(np.asarray(load_image(source)), np.asarray(from_path))


def test_prepare_batch_is_uint8_square(examples_dir: Path) -> None:
    batch, sizes = prepare_batch([examples_dir / "coffee.jpg", examples_dir / "chelsea.jpg"], size=512)
    assert batch.shape == (2, 3, 512, 512) and str(batch.dtype) == "torch.uint8"
    assert sizes == [(600, 400), (451, 300)]


@pytest.mark.parametrize(
    ("mode", "value", "expected"),
    [
        ("L", 77, (77, 77, 77)),
        ("LA", (77, 255), (77, 77, 77)),
        ("LA", (0, 0), (255, 255, 255)),  # transparent: composited on white
        ("RGBA", (10, 20, 30, 255), (10, 20, 30)),
        ("RGBA", (10, 20, 30, 0), (255, 255, 255)),
        ("I;16", 65535, (255, 255, 255)),
        ("I;16", 32896, (128, 128, 128)),
        ("CMYK", (0, 255, 255, 0), (255, 0, 0)),
    ],
)
def test_modes_become_rgb(mode: str, value, expected) -> None:
    img = Image.new(mode, (40, 30), value)
    fmt = "TIFF" if mode == "CMYK" else "PNG"
    out = load_image(encode(img, fmt))
    assert out.mode == "RGB" and out.size == (40, 30)
    assert tuple(np.asarray(out)[5, 5]) == pytest.approx(expected, abs=1)


def test_palette_with_and_without_transparency() -> None:
    p = Image.new("P", (32, 32), 1)
    p.putpalette([0, 0, 0, 200, 10, 10] + [0] * 762)
    assert tuple(np.asarray(load_image(encode(p)))[0, 0]) == (200, 10, 10)
    p.info["transparency"] = 1
    assert tuple(np.asarray(load_image(encode(p, transparency=1)))[0, 0]) == (255, 255, 255)


def test_exif_orientation_is_applied() -> None:
    img = Image.new("RGB", (64, 32), (0, 0, 255))
    img.paste((255, 0, 0), (0, 0, 32, 32))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    out = np.asarray(load_image(encode(img, "JPEG", exif=exif, quality=95)))
    assert out.shape == (64, 32, 3)  # portrait once upright
    assert out[5, 16, 0] > 200 and out[5, 16, 2] < 60  # the red half is now on top


def _bomb() -> bytes:
    return encode(Image.new("1", (9000, 9000)))  # 81 megapixels in a few kB


@pytest.mark.parametrize(
    ("source", "limits", "message"),
    [
        (b"", ImageLimits(), "empty"),
        (b"definitely not an image" * 20, ImageLimits(), "not an image format"),
        ("truncated", ImageLimits(), "corrupt or truncated"),
        ("bomb", ImageLimits(), "too large|megapixels"),
        ("coffee", ImageLimits(max_bytes=10_000), "limit"),
        ("tiny", ImageLimits(), "at least 16 px"),
        ("missing", ImageLimits(), "No image file"),
    ],
)
def test_bad_images_fail_clearly(source, limits, message: str, examples_dir: Path, tmp_path: Path) -> None:
    coffee = (examples_dir / "coffee.jpg").read_bytes()
    source = (
        {
            "truncated": coffee[: len(coffee) // 2],
            "bomb": _bomb(),
            "coffee": examples_dir / "coffee.jpg",
            "tiny": encode(Image.new("RGB", (1, 1))),
            "missing": tmp_path / "nope.jpg",
        }.get(source, source)
        if isinstance(source, str)
        else source
    )
    with pytest.raises(ImageError, match=message):
        load_image(source, limits)


def test_zero_byte_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        load_image(empty)


@pytest.mark.parametrize("source", [123, 4.5, None, ["a.jpg"], {"image": 1}])
def test_wrong_types_fail_clearly(source) -> None:
    with pytest.raises(InvalidInputError, match="Expected an image"):
        load_image(source)


def test_bad_arrays_fail_clearly() -> None:
    with pytest.raises(ImageError, match="HxW"):
        load_image(np.zeros((4, 40, 40, 3), np.uint8))
    with pytest.raises(InvalidInputError, match="No images"):
        prepare_batch([])


def _jpeg_declaring(w: int, h: int) -> bytes:
    """A small JPEG whose frame header declares w x h (only its header is ever read here)."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 40, 40)).save(buf, "JPEG")
    data = buf.getvalue()
    at = data.index(b"\xff\xc0") + 5  # SOF0: marker, length, precision, then height and width
    return data[:at] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + data[at + 4 :]


def test_the_draft_size_from_the_header_is_pillows(monkeypatch) -> None:
    """A batch job counts a plain JPEG's decoded pixels from its frame header (arrcoc.images
    draft_size, on a view of the upload): the same size Pillow's own draft gives, for sizes from
    tiny to beyond the scale of 8, and the same pixels as Pillow's path in the job's check."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from arrcoc.images import draft_size, jpeg_header
    from arrcoc.service.jobs.archive import _decoded_size

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # Pillow's own bomb check is not the point here

    @settings(max_examples=300, deadline=None)
    @given(st.integers(1, 30000), st.integers(1, 30000), st.sampled_from([64, 512, 1000, 1024]))
    def same(w: int, h: int, side: int) -> None:
        data = _jpeg_declaring(w, h)
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (side, side))
            expect = img.size
        assert draft_size((w, h), side) == expect
        head = jpeg_header(memoryview(data))
        assert head is not None and head.size == (w, h)
        assert _decoded_size(memoryview(data), side) == expect

    same()


def _truncations() -> dict[str, tuple[bytes, bool]]:
    """A photo's JPEG (baseline and progressive) cut three ways Pillow refuses as truncated, and
    three endings it decodes: {name: (bytes, Pillow decodes it)}."""
    photo = Image.open(Path(__file__).resolve().parent.parent / "arrcoc" / "examples" / "coffee.jpg")
    exif = Image.Exif()
    exif[0x0112] = 1
    baseline = encode(photo, "JPEG", quality=90, exif=exif)
    progressive = encode(photo, "JPEG", quality=90, progressive=True)
    scan = baseline.index(b"\xff\xda")
    return {
        "cut in the scan": (baseline[: len(baseline) // 2], False),
        "cut between progressive scans": (progressive[: len(progressive) // 2], False),
        "cut before its end marker": (baseline[:-2], False),
        "cut after the scan header": (baseline[: scan + 14], False),
        "whole": (baseline, True),
        "whole, progressive": (progressive, True),
        "bytes after its end marker": (baseline + b"\0" * 100, True),
    }


@pytest.mark.parametrize("case", list(_truncations()))
def test_truncated_jpegs_never_go_to_the_gpu_decoder(case: str) -> None:
    """nvJPEG fills what is missing grey and calls it decoded, where Pillow refuses a JPEG cut short
    (in a scan, between progressive scans, before its end marker): such a JPEG stays on the CPU
    path (the GPU gate, preprocess._header, says no), so both paths give Pillow's answer."""
    from arrcoc.images import decode, jpeg_complete
    from arrcoc.preprocess import _header

    data, decodes = _truncations()[case]
    assert jpeg_complete(data) is decodes
    assert _header(data, ImageLimits())[0] is decodes
    if decodes:
        assert decode(data).size == (600, 400)
    else:
        with pytest.raises(ImageError, match="truncated"):
            decode(data)
