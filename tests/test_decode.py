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
    good, bad = dec.decode([data, b"\xff\xd8 not a jpeg"], view_side=256)
    assert isinstance(bad, ImageError)
    assert torch.equal(good.pixels, to_tensor(decode_image(data).image, 512))
    assert good.size == Image.open(io.BytesIO(data)).size and max(good.view.shape[1:]) == 256


def test_a_gpu_decoders_batch_sends_each_image_its_way_and_keeps_the_order(monkeypatch) -> None:
    """A batch mixing JPEGs (nvJPEG's), a PNG and an oversized JPEG (Pillow's) and a broken file:
    each position gets its own image or its own error. Stand-in: the nvJPEG call is Pillow's decode
    here (nvJPEG cannot run in CI; on a GPU, test_gpu_decoding_is_close_to_pillow_and_upright)."""
    photo = Image.open(EXAMPLES / "coffee.jpg")
    png = io.BytesIO()
    photo.save(png, "PNG")
    images = [
        (EXAMPLES / "chelsea.jpg").read_bytes(),
        png.getvalue(),
        b"\xff\xd8 broken",
        jpeg(photo.resize((8000, 6000))),
        (EXAMPLES / "coffee.jpg").read_bytes(),
    ]
    cpu = Decoder(torch.device("cpu"), 128, ImageLimits())
    gpu = Decoder(torch.device("cpu"), 128, ImageLimits())
    gpu.gpu = True
    sent: list[int] = []

    def nvjpeg(encoded, view_side):
        sent.extend(len(e.data) for e in encoded)
        return [cpu._cpu_one(e.data, view_side) for e in encoded]

    monkeypatch.setattr(gpu, "_gpu_many", nvjpeg)
    ours, pillow = gpu.decode(images, view_side=64), cpu.decode(images, view_side=64)
    assert sent == [len(images[0]), len(images[4])]  # only the plain JPEGs within the limit, in one call
    assert isinstance(ours[2], ImageError) and isinstance(pillow[2], ImageError)
    for k in (0, 1, 3, 4):
        assert torch.equal(ours[k].pixels, pillow[k].pixels) and ours[k].size == pillow[k].size, k


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or not uses_gpu_decoder(torch.device("cuda")),
    reason="needs a GPU and torchvision's nvJPEG",
)
def test_gpu_decoding_is_close_to_pillow_and_upright() -> None:
    photo = Image.open(EXAMPLES / "coffee.jpg")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: upright is 90 degrees clockwise
    rotated = jpeg(photo, exif=exif.tobytes())
    phone = jpeg(photo.resize((8000, 6000)))  # over the pixel limit: the CPU path reduces it while decoding
    images = [(EXAMPLES / n).read_bytes() for n in ("coffee.jpg", "chelsea.jpg")] + [
        rotated,
        b"\xff\xd8 broken",
        phone,
    ]
    gpu = Decoder(torch.device("cuda"), 512, ImageLimits())
    cpu = Decoder(torch.device("cpu"), 512, ImageLimits())
    g, c = gpu.decode(images, view_side=300), cpu.decode(images, view_side=300)
    assert isinstance(g[3], ImageError) and isinstance(c[3], ImageError)
    for a, b in zip(g[:3], c[:3], strict=True):
        assert a.pixels.is_cuda and a.size == b.size
        assert (a.pixels.cpu().int() - b.pixels.int()).abs().float().mean() < 2.0  # a level here and there
    assert g[2].size == (photo.height, photo.width)  # upright
    assert g[4].size == (8000, 6000) and torch.equal(g[4].pixels.cpu(), c[4].pixels)


def _pillow_header(data: bytes) -> tuple[tuple[int, int], int, int] | None:
    """What Pillow's full parse says of a JPEG: (size, components, orientation), or None."""
    try:
        img = Image.open(io.BytesIO(data))
        if img.format != "JPEG":
            return None
        return img.size, {"L": 1, "RGB": 3, "CMYK": 4}[img.mode], int(img.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 -- unreadable: no answer to compare
        return None


def _photo_jpeg(w: int, h: int, mode: str, orientation: int | None, **kw) -> bytes:
    rng = np.random.default_rng(w * h)
    img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).convert(mode)
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        exif[0x010F] = "camera"
        kw["exif"] = exif.tobytes()
    return jpeg(img, **kw)


@pytest.mark.parametrize("mode", ["RGB", "L", "CMYK"])
@pytest.mark.parametrize("orientation", [None, 1, 6, 8])
@pytest.mark.parametrize("progressive", [False, True])
def test_the_quick_jpeg_header_reads_what_pillow_reads(
    mode: str, orientation: int | None, progressive: bool
) -> None:
    from arrcoc.images import jpeg_header

    data = _photo_jpeg(37, 23, mode, orientation, progressive=progressive)
    head = jpeg_header(data)
    assert head is not None
    assert (head.size, head.components, head.orientation) == _pillow_header(data)


def test_the_quick_jpeg_header_leaves_every_odd_file_to_pillow() -> None:
    """Mutated and cut headers: where the quick reader answers, Pillow gives the same answer (or
    cannot read the file, which then fails on the decoding path as before); what it cannot read
    plainly it leaves to Pillow (None)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from arrcoc.images import jpeg_header

    base = _photo_jpeg(40, 30, "RGB", 6)
    sof = base.index(b"\xff\xc0")

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(st.integers(0, sof + 19), st.integers(0, 255), st.integers(2, len(base)))
    def check(at: int, value: int, cut: int) -> None:
        data = (base[:at] + bytes([value]) + base[at + 1 :])[:cut]
        head = jpeg_header(data)
        if head is not None:
            pillow = _pillow_header(data)
            assert pillow is None or (head.size, head.components, head.orientation) == pillow, (
                at,
                value,
                cut,
            )

    check()
    assert jpeg_header(b"\x89PNG\r\n\x1a\n") is None and jpeg_header(base[: sof + 4]) is None
    assert jpeg_header(_photo_jpeg(40, 30, "RGB", 9)) is None  # an orientation out of range: Pillow's call


def test_gpu_header_check_takes_the_same_jpegs_as_pillow() -> None:
    """The decoder's header check (which JPEGs go to nvJPEG, upright size) with the quick reader
    is what it was with Pillow's full parse, including the limits."""
    from arrcoc.preprocess import _header

    limits = ImageLimits(max_pixels=40 * 30 + 1, min_side=16)
    for data, expected in (
        (_photo_jpeg(40, 30, "RGB", 6), (True, 6, (30, 40))),
        (_photo_jpeg(40, 30, "L", None), (True, 1, (40, 30))),
        (_photo_jpeg(40, 30, "CMYK", None), (False, 1, (0, 0))),  # CMYK: Pillow decodes it
        (_photo_jpeg(50, 30, "RGB", None), (False, 1, (0, 0))),  # over the pixel limit: Pillow, with draft
        (_photo_jpeg(40, 12, "RGB", None), (False, 1, (0, 0))),  # a side under the minimum: Pillow's error
        (b"\xff\xd8\xff\xe0 not a jpeg", (False, 1, (0, 0))),
    ):
        assert _header(data, limits) == expected


def test_large_photos_are_resized_a_few_at_a_time_with_the_same_pixels(monkeypatch) -> None:
    """The decoder's resize takes a bounded number of pixels per call (a step of 12 MP photos was
    one 9.4 GB float tensor on the GPU); how the images are split changes no pixel."""
    import arrcoc.preprocess as pre

    rng = np.random.default_rng(7)
    images = [torch.from_numpy(rng.integers(0, 255, (3, 300, 400), dtype=np.uint8)) for _ in range(5)]
    images.append(torch.from_numpy(rng.integers(0, 255, (3, 200, 200), dtype=np.uint8)))
    dec = Decoder(torch.device("cpu"), 64, ImageLimits())
    whole = dec._finish(images, view_side=100)
    calls: list[int] = []
    real = pre.resize
    monkeypatch.setattr(pre, "resize", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    monkeypatch.setattr(pre, "RESIZE_PIXELS", 2 * 300 * 400)
    split = dec._finish(images, view_side=100)
    assert max(calls) <= 2 and sum(c for c in calls) >= 6  # two 300x400 photos a call at most
    for a, b in zip(whole, split, strict=True):
        assert torch.equal(a.pixels, b.pixels) and torch.equal(a.view, b.view) and a.size == b.size


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or not uses_gpu_decoder(torch.device("cuda")),
    reason="needs a GPU and torchvision's nvJPEG",
)
def test_gpu_batcher_decode_stage_overlapping_the_engine_gives_the_pipelines_results() -> None:
    """The batcher's decode stage decodes and resizes each batch on a stream of its own while the
    engine runs the batch before: many concurrent requests (several photos, a 12 MP one among them,
    so one batch's decode overlaps the last one's run) give the pipeline's own result
    for each photo (to float rounding: other batch sizes), never a neighbour's or a half-resized one."""
    from concurrent.futures import ThreadPoolExecutor

    from arrcoc.request import Controls
    from arrcoc.service.host.runtime import Runtime
    from arrcoc.settings import default_settings

    photos = [(EXAMPLES / n).read_bytes() for n in ("coffee.jpg", "chelsea.jpg", "astronaut.jpg")]
    photos += [jpeg(Image.open(EXAMPLES / "coffee.jpg").resize((4032, 3024)))]  # a 12 MP one: a longer resize
    runtime = Runtime(
        default_settings(
            engine={"device": "cuda", "backend": "eager", "backends": ("eager",)},
            service={"broker_url": None},
        )
    )
    try:
        pipe = runtime.pipeline
        expected = [pipe.infer([p], "the red one")[0].relevance for p in photos]
        with ThreadPoolExecutor(24) as pool:
            got = list(
                pool.map(
                    lambda i: (
                        i % len(photos),
                        runtime.infer(photos[i % len(photos)], "the red one", Controls(), 60.0),
                    ),
                    range(480),
                )
            )
        assert runtime.submitted == 480
        decode_ms = [r.timings_ms.get("batch_decode_ms") for _, r in got]
        assert all(ms is not None and ms > 0 for ms in decode_ms)
        for i, r in got:  # batches of other sizes may round differently; a race would be far off
            assert float(np.abs(r.relevance - expected[i]).max()) < 1e-4
    finally:
        runtime.close()


def test_a_jpeg_reaches_nvjpeg_as_a_tensor_over_its_own_bytes_without_a_warning() -> None:
    """What the GPU decoder hands nvJPEG: the file's bytes as they are (no copy: a 12 MP photo is
    megabytes), unchanged, and torch's not-writable warning kept out of the server's log."""
    import subprocess
    import sys

    from arrcoc.preprocess import jpeg_tensor

    data = (EXAMPLES / "coffee.jpg").read_bytes()
    # torch warns once per process: a fresh one, where any warning is an error
    fresh = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import sys; from arrcoc.preprocess import jpeg_tensor;"
            " print(jpeg_tensor(open(sys.argv[1], 'rb').read()).numel())",
            str(EXAMPLES / "coffee.jpg"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fresh.returncode == 0 and fresh.stdout.split()[-1] == str(len(data)), fresh.stderr[-2000:]
    t = jpeg_tensor(data)
    assert t.dtype == torch.uint8 and t.numel() == len(data) and bytes(t.numpy()) == data
    assert t.data_ptr() == np.frombuffer(data, np.uint8).ctypes.data  # the same memory


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or not uses_gpu_decoder(torch.device("cuda")),
    reason="needs a GPU and torchvision's nvJPEG",
)
def test_gpu_overlays_come_back_as_whole_jpegs_each_its_own() -> None:
    """nvJPEG encodes a batch's overlays on the device; they come to the host in one copy and are
    cut apart there: each is a whole JPEG of its own picture (size and look), none a neighbour's."""
    from arrcoc import overlays

    photos = [Image.open(EXAMPLES / n).convert("RGB") for n in ("coffee.jpg", "chelsea.jpg", "astronaut.jpg")]
    views = [torch.from_numpy(np.asarray(p).transpose(2, 0, 1).copy()).cuda() for p in photos]
    maps = [np.random.default_rng(i).random((32, 32)).astype(np.float32) for i in range(len(views))]
    got = overlays.encode(views, maps, "jpeg")
    cpu = overlays.encode([v.cpu() for v in views], maps, "jpeg")
    assert len(got) == 3
    for data, ref, photo in zip(got, cpu, photos, strict=True):
        a, b = (
            np.asarray(Image.open(io.BytesIO(data)), dtype=np.int16),
            np.asarray(Image.open(io.BytesIO(ref)), dtype=np.int16),
        )
        assert (
            data[:2] == b"\xff\xd8"
            and data[-2:] == b"\xff\xd9"
            and a.shape[:2] == (photo.height, photo.width)
        )
        # the same picture from two JPEG encoders (nvJPEG keeps full-resolution colour, Pillow halves
        # it: 5.4 levels apart on coffee.jpg on the H100); another picture would be tens of levels off
        assert np.abs(a - b).mean() < 12.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_foveated_overlays_are_the_cpus_picture() -> None:
    """A batch job's foveated overlays drawn on the device (one foveate call per picture size, PNG
    so that no encoder differs) are the CPU's pictures to one uint8 level."""
    from arrcoc import overlays

    photos = [
        Image.open(EXAMPLES / n).convert("RGB")
        for n in ("coffee.jpg", "chelsea.jpg", "astronaut.jpg", "coffee.jpg")
    ]
    views = [torch.from_numpy(np.asarray(p).transpose(2, 0, 1).copy()).cuda() for p in photos]
    rng = np.random.default_rng(0)
    budgets = (rng.integers(64, 401, (len(views), 32, 32)) * (rng.random((len(views), 32, 32)) > 0.7)).astype(
        np.float32
    )
    got = overlays.encode(views, budgets, "png", kind="foveated")
    cpu = overlays.encode([v.cpu() for v in views], budgets, "png", kind="foveated")
    for data, ref in zip(got, cpu, strict=True):
        a, b = (
            np.asarray(Image.open(io.BytesIO(data)), dtype=np.int16),
            np.asarray(Image.open(io.BytesIO(ref)), dtype=np.int16),
        )
        assert a.shape == b.shape and np.abs(a - b).max() <= 1


def test_decode_pending_gives_each_request_its_pixels_and_the_stage_time_in_order() -> None:
    """The batcher's GPU decode stage (RelevancePipeline.decode_pending) on the CPU: nvJPEG cannot
    run in CI, so a stand-in decoder answers `finish` (said here: the one mock). Requests left for
    the GPU get their pixels, those decoded already keep theirs, a bad one comes back as its error,
    all in order, and every request carries the stage's time."""
    from arrcoc.pipeline import PreparedRequest, RelevancePipeline
    from arrcoc.preprocess import Encoded, Pixels
    from arrcoc.request import Controls

    class StandIn:
        def finish(self, encoded):
            return [
                ImageError("unreadable")
                if e.data == b"bad"
                else Pixels(torch.full((3, 4, 4), len(e.data), dtype=torch.uint8), e.size, None)
                for e in encoded
            ]

    pipe = RelevancePipeline.__new__(RelevancePipeline)  # the decoder is all decode_pending uses
    pipe.decoder = StandIn()

    def req(data: bytes | None, pixels: torch.Tensor | None = None) -> PreparedRequest:
        return PreparedRequest(
            pixels, (4, 4), "q", Controls(), 0.1, None if data is None else Encoded(data, 1, (4, 4))
        )

    ready = torch.full((3, 4, 4), 7, dtype=torch.uint8)
    out = pipe.decode_pending([req(b"abc"), req(None, ready), req(b"bad"), req(b"abcdef")], lambda: 2.5)
    assert isinstance(out[2], ImageError)
    assert [int(o.pixels[0, 0, 0]) for o in (out[0], out[1], out[3])] == [3, 7, 6]
    assert all(o.batch_decode_ms == 2.5 and o.encoded is None for o in (out[0], out[1], out[3]))


def test_resize_by_size_group_is_one_call_per_group_with_each_images_own_pixels(monkeypatch) -> None:
    """The GPU branch's resize on CPU tensors: images of one shape going to one size are resized in
    one call; every image gets the pixels it gets resized alone, in its own place."""
    import arrcoc.preprocess as pre

    rng = np.random.default_rng(3)
    shapes = [(60, 80), (45, 30), (60, 80), (60, 80), (45, 30)]
    images = [torch.from_numpy(rng.integers(0, 255, (3, h, w), dtype=np.uint8)) for h, w in shapes]
    sizes = [(32, 32), (32, 32), (32, 32), (16, 24), (32, 32)]
    calls: list[int] = []
    real = pre.resize
    monkeypatch.setattr(pre, "resize", lambda x, *a, **k: calls.append(x.shape[0]) or real(x, *a, **k))
    got = pre.resize_groups(images, sizes)
    assert sorted(calls) == [1, 2, 2]  # (60x80 -> 32) x2, (45x30 -> 32) x2, (60x80 -> 16x24) x1
    for img, size, out in zip(images, sizes, got, strict=True):
        assert torch.equal(out, real(img.unsqueeze(0), *size)[0])


def test_a_steps_overlays_drawn_as_one_tensor_operation_match_pillows_drawing() -> None:
    """The GPU branch's overlay drawing on CPU tensors: views of several sizes in one call, each
    the same picture as arrcoc.render.overlay draws with Pillow (cells on the same pixels, the
    blend within one level of rounding), none a neighbour's."""
    from arrcoc.render import blend_overlays, overlay

    rng = np.random.default_rng(5)
    shapes = [(600, 800), (333, 517), (600, 800), (64, 64)]
    views = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    maps = rng.random((len(views), 32, 32)).astype(np.float32)
    got = blend_overlays([torch.from_numpy(v.transpose(2, 0, 1).copy()) for v in views], maps)
    for view, m, picture in zip(views, maps, got, strict=True):
        ref = np.asarray(overlay(Image.fromarray(view), m), dtype=np.int16)
        assert picture.dtype == torch.uint8 and tuple(picture.shape) == (3, *view.shape[:2])
        assert np.abs(picture.numpy().transpose(1, 2, 0).astype(np.int16) - ref).max() <= 1


def test_a_map_that_is_no_number_is_drawn_as_the_lowest_colour_not_an_index_out_of_range() -> None:
    """A map holding NaN or infinities (a model fault) draws: such a cell takes the colour table's
    first (NaN, -inf) or last (+inf) colour, as Pillow's drawing of the same map does. As an index
    it would be out of range: an IndexError on a CPU, and on a GPU a device-side assert that would
    leave the engine process's CUDA context unusable for every later request."""
    from arrcoc.render import blend_overlays, overlay

    rng = np.random.default_rng(6)
    view = rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)
    bad = rng.random((32, 32)).astype(np.float32)
    bad[0, 0], bad[5, 7], bad[31, 31] = np.nan, -np.inf, np.inf
    clean = np.nan_to_num(bad, nan=0.0, posinf=1.0, neginf=0.0)
    (got,) = blend_overlays([torch.from_numpy(view.transpose(2, 0, 1).copy())], bad[None])
    (same,) = blend_overlays([torch.from_numpy(view.transpose(2, 0, 1).copy())], clean[None])
    assert torch.equal(got, same)
    drawn = np.asarray(overlay(Image.fromarray(view), bad), dtype=np.int16)
    assert np.abs(got.numpy().transpose(1, 2, 0).astype(np.int16) - drawn).max() <= 1


def test_a_png_in_a_gpu_decoded_step_falls_back_alone_and_the_step_runs(monkeypatch) -> None:
    """A batch-job step of JPEGs with a PNG among them on the GPU path: the JPEGs go to the GPU
    decoder in one call, the PNG to Pillow, and every item has its result, the PNG's the same as
    its own request's. Stand-in: the nvJPEG call is Pillow's decode (nvJPEG cannot run in CI)."""
    from arrcoc.request import Controls
    from arrcoc.service.host.runtime import Runtime
    from arrcoc.settings import default_settings

    photo = Image.open(EXAMPLES / "coffee.jpg")
    png = io.BytesIO()
    photo.resize((320, 240)).save(png, "PNG")
    step = [
        (EXAMPLES / "chelsea.jpg").read_bytes(),
        png.getvalue(),
        (EXAMPLES / "astronaut.jpg").read_bytes(),
    ]
    runtime = Runtime(
        default_settings(
            engine={"device": "cpu", "backend": "eager", "backends": ("eager",)}, service={"broker_url": None}
        )
    )
    try:
        dec = runtime.pipeline.decoder
        sent: list[int] = []

        def nvjpeg(encoded, view_side):
            sent.append(len(encoded))
            return [dec._cpu_one(e.data, view_side) for e in encoded]

        monkeypatch.setattr(dec, "gpu", True)
        monkeypatch.setattr(dec, "_gpu_many", nvjpeg)
        batch = runtime.process(step, ["the red one"] * 3, Controls(), "jpeg")
        assert sent == [2] and batch.outputs.ok.tolist() == [True] * 3 and batch.errors == [None] * 3
        assert all(data[:2] == b"\xff\xd8" for data in batch.overlays)
        alone = runtime.pipeline.infer([step[1]], "the red one")[0]
        np.testing.assert_allclose(batch.outputs.relevance[1], alone.relevance, atol=1e-5)
        assert batch.outputs.selected[1].tolist() == alone.selected.tolist()
    finally:
        runtime.close()


def test_a_batch_of_large_photos_decodes_in_bounded_calls_in_order(monkeypatch) -> None:
    """`Decoder.finish` hands nvJPEG runs of photos of at most DECODE_PIXELS decoded pixels (a
    photo larger than that alone), every photo once and in order. nvJPEG cannot run in CI: the
    GPU call is a stand-in that records each call's photos (the only mock here)."""
    import arrcoc.preprocess as pre

    monkeypatch.setattr(pre, "DECODE_PIXELS", 1000)
    calls: list[list[bytes]] = []

    def gpu_many(self, encoded, view_side):
        calls.append([e.data for e in encoded])
        return [e.data for e in encoded]

    monkeypatch.setattr(pre.Decoder, "_gpu_many", gpu_many)
    dec = Decoder.__new__(Decoder)  # finish uses nothing of its state but the call above
    sizes = [
        (20, 20),
        (20, 20),
        (10, 10),
        (40, 40),
        (10, 50),
        (30, 10),
        (5, 5),
    ]  # 400, 400, 100, 1600, 500, 300, 25
    encoded = [pre.Encoded(bytes([i]), 1, size) for i, size in enumerate(sizes)]
    assert dec.finish(encoded) == [e.data for e in encoded]
    assert calls == [[b"\0", b"\1", b"\2"], [b"\3"], [b"\4", b"\5", b"\6"]]
    ordinary = [pre.Encoded(bytes([i]), 1, (800, 600)) for i in range(128)]  # a step of photos: one call
    monkeypatch.setattr(pre, "DECODE_PIXELS", 1 << 29)
    calls.clear()
    dec.finish(ordinary)
    assert len(calls) == 1


def test_a_jpeg_nvjpeg_refuses_goes_to_pillow_alone_and_its_neighbours_stay_on_the_gpu_path(
    monkeypatch, caplog
) -> None:
    """`Decoder._gpu_many`: when the run's one nvJPEG call is refused, each JPEG is tried alone
    (arrcoc.isolation.isolated, the one place a batch runs again item by item); the one nvJPEG
    refuses alone goes to Pillow, and its neighbours keep the GPU path's decode and resize.
    Stand-in: nvJPEG is Pillow's decode that refuses the cat (nvJPEG cannot run in CI; the only
    mock here)."""
    import arrcoc.preprocess as pre

    photos = [(EXAMPLES / n).read_bytes() for n in ("coffee.jpg", "chelsea.jpg", "astronaut.jpg")]
    calls: list[int] = []

    def nvjpeg_decode(datas, device):
        calls.append(len(datas))
        if any(bytes(d.numpy()) == photos[1] for d in datas):
            raise RuntimeError("nvJPEG: unsupported")
        return [
            torch.from_numpy(
                np.asarray(Image.open(io.BytesIO(bytes(d.numpy()))).convert("RGB")).transpose(2, 0, 1).copy()
            )
            for d in datas
        ]

    monkeypatch.setattr(pre.nvjpeg, "decode", nvjpeg_decode)
    dec = Decoder(torch.device("cpu"), 64, ImageLimits())
    encoded = [dec._encoded(data) for data in photos]
    assert all(e is not None for e in encoded)  # headers pass: all three are the GPU's to decode
    caplog.set_level("WARNING", logger="arrcoc.isolation")
    coffee, cat, astronaut = dec._gpu_many(encoded, 32)
    assert calls == [3, 1, 1, 1]  # the run, then each alone
    assert "running its items one by one" in caplog.text
    pillow = dec._cpu_one(photos[1], 32)
    assert torch.equal(cat.pixels, pillow.pixels) and torch.equal(cat.view, pillow.view)  # as on a CPU
    for got, e in ((coffee, encoded[0]), (astronaut, encoded[2])):  # still the GPU path's
        alone = dec._gpu_many([e], 32)[0]
        assert torch.equal(got.pixels, alone.pixels) and torch.equal(got.view, alone.view)
        assert got.size == alone.size
