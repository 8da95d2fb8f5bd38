"""The foveated view (what a VLM would be given under a result's budgets) and the selected boxes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arrcoc.foveate import foveate, uniform_view, view_tokens
from arrcoc.result import cell_boxes

torch.set_num_threads(2)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _photo(h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Detail everywhere (noise over a gradient), so any loss of resolution shows."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 160, w).view(1, 1, w).expand(3, h, w)
    return (ramp + torch.randint(0, 96, (3, h, w), generator=g)).clamp(0, 255).to(torch.uint8).unsqueeze(0)


def _cell(x: torch.Tensor, r: int, c: int, g: int) -> torch.Tensor:
    h, w = x.shape[-2:]
    return x[..., r * h // g : (r + 1) * h // g, c * w // g : (c + 1) * w // g]


@pytest.mark.parametrize("size", [(512, 512), (768, 1024), (4096, 3072)])
def test_max_budget_keeps_pixels_and_unselected_blurs(size: tuple[int, int]) -> None:
    h, w = size
    g = 32
    img = _photo(h, w)
    budget = torch.zeros(1, g, g)
    budget[0, 3, 5] = 400  # the most a cell can get: 20 x 20 patches of 14 px = 280 px a side
    budget[0, 10, 20] = 64  # the least: 8 x 8 patches = 112 px a side
    out = foveate(img, budget, patch=14)
    assert out.shape == img.shape and out.dtype == torch.uint8
    kept = psnr(_cell(out, 3, 5, g), _cell(img, 3, 5, g))
    blurred = psnr(_cell(out, 20, 20, g), _cell(img, 20, 20, g))
    assert kept == float("inf") or kept > 60, "a max-budget cell affords its own pixels: unchanged"
    assert blurred < 30, f"an unselected cell is blurred ({blurred:.1f} dB)"
    low = psnr(_cell(out, 10, 20, g), _cell(img, 10, 20, g))
    if h // g > 112:  # 128-px cells: 64 tokens buy 112 px a side, so some detail goes
        assert blurred < low < kept
    else:
        assert low > 60


def test_non_multiple_size_and_float_input() -> None:
    img = _photo(300, 450).float()
    budget = torch.zeros(2, 32, 32)
    budget[:, :16] = 400  # top half selected
    out = foveate(torch.cat([img, img]), budget, patch=16)
    assert out.shape == (2, 3, 300, 450) and out.dtype == torch.float32
    top, bottom = psnr(out[..., :140, :], img[..., :140, :]), psnr(out[..., 160:, :], img[..., 160:, :])
    assert top > bottom + 8, (top, bottom)


def test_batched_equals_one_by_one() -> None:
    imgs = torch.cat([_photo(256, 256, s) for s in range(3)])
    g = torch.Generator().manual_seed(1)
    budget = torch.randint(0, 401, (3, 32, 32), generator=g).float() * (
        torch.rand(3, 32, 32, generator=g) > 0.7
    )
    together = foveate(imgs, budget, patch=4, base_side=2)
    alone = torch.cat([foveate(imgs[i : i + 1], budget[i : i + 1], patch=4, base_side=2) for i in range(3)])
    assert torch.equal(together, alone)


def _per_cell_reference(
    images: torch.Tensor, budget_map: torch.Tensor, patch: int, base_side: int
) -> torch.Tensor:
    """The foveated view drawn the plain way, cell by cell: each cell cut out, averaged down to
    what its budget affords (F.adaptive_avg_pool2d), interpolated back (F.interpolate, bilinear)
    and put back; on a canvas of whole cells for sizes that are not multiples of the grid."""
    from arrcoc.foveate import _levels, token_side

    b, ch, h, w = images.shape
    g = budget_map.shape[-1]
    ph, pw = -(-h // g), -(-w // g)
    x = torch.nn.functional.interpolate(
        images.float(), size=(ph * g, pw * g), mode="bilinear", align_corners=False
    )
    cells = x.reshape(b, ch, g, ph, g, pw).permute(0, 2, 4, 1, 3, 5).reshape(b * g * g, ch, ph, pw)
    side = token_side(budget_map.float()).reshape(-1, 1, 1, 1) * patch
    side = torch.where(side > 0, side, torch.full_like(side, float(base_side)))
    out = cells
    for lh, lw in _levels(ph, pw, patch, base_side):
        small = torch.nn.functional.adaptive_avg_pool2d(cells, (lh, lw))
        up = torch.nn.functional.interpolate(small, size=(ph, pw), mode="bilinear", align_corners=False)
        out = torch.where((side.clamp(max=ph) == lh) & (side.clamp(max=pw) == lw), up, out)
    out = out.reshape(b, g, g, ch, ph, pw).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, ph * g, pw * g)
    if (ph * g, pw * g) != (h, w):
        out = torch.nn.functional.interpolate(out, size=(h, w), mode="bilinear", align_corners=False)
        full = ((side.clamp(max=ph) >= ph) & (side.clamp(max=pw) >= pw)).reshape(b, 1, g, g)
        keep = full[:, :, torch.arange(h) * g // h][:, :, :, torch.arange(w) * g // w]
        out = torch.where(keep, images.float(), out)
    return out


@pytest.mark.parametrize(
    ("size", "patch"), [((512, 512), 14), ((300, 450), 16), ((1000, 700), 14), ((4096, 3072), 14)]
)
def test_whole_image_levels_equal_the_per_cell_reference(size: tuple[int, int], patch: int) -> None:
    """The view computes each level on the whole image (no per-cell tensors); the result is the
    plain per-cell one to float rounding: <= 1e-4 in float, at most 1 level in uint8 (a value on a
    rounding boundary), and that on under 0.01% of the pixels."""
    h, w = size
    g = torch.Generator().manual_seed(h)
    img = _photo(h, w, seed=1)
    budget = torch.randint(64, 401, (1, 32, 32), generator=g).float() * (
        torch.rand(1, 32, 32, generator=g) > 0.6
    )
    reference = _per_cell_reference(img, budget, patch, 4)
    assert (foveate(img.float(), budget, patch) - reference).abs().max() <= 1e-4
    delta = (foveate(img, budget, patch).int() - reference.round().clamp(0, 255).int()).abs()
    assert delta.max() <= 1 and (delta > 0).float().mean() < 1e-4


def test_compiles_whole_and_matches_eager() -> None:
    """One graph (fullgraph), the same picture as eager to one uint8 level."""
    img = torch.cat([_photo(256, 256, s) for s in range(2)])
    budget = torch.zeros(2, 32, 32)
    budget[:, 4:9, 3:12] = 144
    compiled = torch.compile(foveate, fullgraph=True)
    assert (compiled(img, budget, 4).int() - foveate(img, budget, 4).int()).abs().max() <= 1


def test_uniform_view_and_tokens() -> None:
    img = _photo(512, 512)
    full = uniform_view(img, 1024, patch=16)
    assert psnr(full, img) == float("inf") or psnr(full, img) > 60, (
        "1024 tokens of 16 px cover 512 px exactly"
    )
    assert psnr(uniform_view(img, 64, patch=16), img) < 25
    budget = torch.zeros(1, 32, 32)
    budget[0, :2] = 100  # 64 selected cells of 16 px: one 16-px token each at patch 16
    spent = float(view_tokens(budget, (512, 512), patch=16, base_side=4)[0])
    assert spent == pytest.approx(64 + (1024 - 64) / 16)


def test_boxes_map_back_to_original_pixels_non_square() -> None:
    w, h, g = 1000, 600, 32
    cells = np.array([0, 31, 32 * 31, 32 * 31 + 31, 5 * 32 + 7])
    boxes = cell_boxes(cells, g, (w, h))
    assert boxes.tolist()[0] == [0, 0, 32, 19]
    assert boxes[1].tolist() == [969, 0, 1000, 19]
    assert boxes[3].tolist() == [969, 582, 1000, 600]  # 31 * 600 / 32 = 581.25: pixel row 582 is the first
    for (x0, y0, x1, y1), cell in zip(boxes, cells, strict=True):  # every pixel in a box is in its cell
        assert {x * g // w for x in range(x0, x1)} == {cell % g} and {y * g // h for y in range(y0, y1)} == {
            cell // g
        }
    x0, y0, x1, y1 = boxes[4]
    assert (
        0 <= x0 - 7 * w / g < 1
        and 0 <= y0 - 5 * h / g < 1
        and 0 <= x1 - 8 * w / g < 1
        and 0 <= y1 - 6 * h / g < 1
    )
    every = cell_boxes(np.arange(g * g), g, (w, h))
    area = ((every[:, 2] - every[:, 0]) * (every[:, 3] - every[:, 1])).sum()
    assert area == w * h, "the boxes tile the photo"


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="budget_map"):
        foveate(torch.zeros(1, 3, 64, 64), torch.zeros(32, 32))
    with pytest.raises(ValueError, match="at least 1"):
        foveate(torch.zeros(1, 3, 64, 64), torch.zeros(1, 32, 32), patch=0)


def test_cli_writes_the_foveated_view_and_boxes(tmp_path) -> None:
    """`arrcoc infer --foveated`: the view at the photo's own size, sharp where cells were selected;
    the JSON's selected_boxes are the selected cells in the photo's pixels with their tokens."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from PIL import Image

    root = Path(__file__).resolve().parent.parent
    photo = root / "arrcoc/examples/coffee.jpg"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "arrcoc",
            "infer",
            str(photo),
            "-q",
            "the cup",
            "--k",
            "100",
            "--json",
            str(tmp_path / "r.json"),
            "--foveated",
            str(tmp_path / "f.png"),
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    original = Image.open(photo).convert("RGB")
    view = Image.open(tmp_path / "f.png").convert("RGB")
    assert view.size == original.size == tuple(doc["image_size"])
    boxes = np.asarray(doc["selected_boxes"])
    assert doc["selected_boxes_format"] == ["x0", "y0", "x1", "y1", "tokens"]
    assert boxes.shape == (100, 5) and boxes[:, 4].tolist() == doc["budgets"]
    w, h = original.size
    g = doc["grid"]
    for (x0, y0, x1, y1, _), cell in zip(boxes[:5], doc["selected"][:5], strict=True):
        assert (y0 * g // h, x0 * g // w) == divmod(cell, g) and x1 <= w and y1 <= h
    a, v = np.asarray(original, dtype=np.float64), np.asarray(view, dtype=np.float64)
    sel = np.zeros((h, w), dtype=bool)
    for x0, y0, x1, y1, _ in boxes:
        sel[y0:y1, x0:x1] = True
    err_in, err_out = np.abs(a - v)[sel].mean(), np.abs(a - v)[~sel].mean()
    assert err_in < 0.5 and err_out > 3, (err_in, err_out)  # a PNG: the photo inside, blurred outside


def test_demo_view_is_sharp_on_selected_cells() -> None:
    """demo.views.foveated_view: the displayed photo with only the selected cells sharp, and words
    that name the cells, tokens and the base level."""
    from PIL import Image

    from arrcoc.result import RelevanceResult
    from demo.views import Run, foveated_view

    g = 32
    photo = Image.fromarray(_photo(320, 640)[0].permute(1, 2, 0).numpy())
    budget_map = np.zeros((g, g))
    budget_map[0, :4] = 400
    rel = np.zeros((g, g))
    result = RelevanceResult(
        variant="arrcoc-texture",
        weights_version="v",
        backend="eager",
        query="the red one",
        relevance=rel,
        information=rel,
        perspectival=rel,
        participatory=rel,
        balance=np.full(3, 1 / 3),
        tensions=np.zeros(3),
        selected=np.arange(4),
        budgets=np.full(4, 400),
        budget_map=budget_map,
        texture=np.zeros((13, g, g)),
        image_size=(1280, 640),
        token_budget=1600,
    )
    view, md = foveated_view(Run(photo, result))
    assert view.size == photo.size
    a, v = np.asarray(photo, dtype=np.float64), np.asarray(view, dtype=np.float64)
    assert np.abs(a[:10, :80] - v[:10, :80]).max() == 0, "selected cells: the photo's pixels"
    assert np.abs(a[40:, :] - v[40:, :]).mean() > 10, "the rest: blurred"
    assert "4 selected cells" in md and "1,600 tokens" in md and "4 of them afford every pixel" in md


def test_one_photos_view_is_drawn_at_a_bounded_working_size() -> None:
    """/infer_foveated drew at the photo's own size: a 356 KB PNG of 16 x 2,500,000 px took 62 s and
    +5.3 GB. The view of one photo is drawn at most IMAGE_MAX_SIDE a side (its aspect kept), a
    plane at a time; a photo within it is drawn at its own size, equal to foveate of the whole."""
    from abuse_inputs import PeakRSS
    from PIL import Image

    from arrcoc.foveate import IMAGE_MAX_SIDE, foveated_image, working_size

    g = 32
    budget_map = np.zeros((g, g))
    budget_map[2:5, 3:9], budget_map[20, 20] = 400, 64
    photo = _photo(600, 900)
    view = foveated_image(Image.fromarray(photo[0].permute(1, 2, 0).numpy()), budget_map)
    whole = foveate(photo, torch.as_tensor(budget_map, dtype=torch.float32)[None])[0]
    assert np.array_equal(np.asarray(view), whole.permute(1, 2, 0).numpy())

    assert working_size((16, 2_500_000)) == (1, IMAGE_MAX_SIDE)
    assert working_size((7000, 5000)) == (IMAGE_MAX_SIDE, 1463)
    thin = Image.new("RGB", (16, 400_000), (90, 120, 200))  # 6.4 MP, thinner than the grid has cells
    with PeakRSS() as mem:
        view = foveated_image(thin, budget_map)
    assert view.size == (1, IMAGE_MAX_SIDE)
    assert mem.growth < 200 * 2**20, f"+{mem.growth / 2**20:.0f} MiB"
