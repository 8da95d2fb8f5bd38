"""Heatmap rendering, shared by the CLI, the demo and batch jobs. numpy + Pillow (torch only inside blend_overlays: a batch step's drawing on the GPU)."""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image

# anchor colours of a perceptually ordered map (dark purple -> orange -> pale yellow, "inferno")
_ANCHORS = np.array(
    [
        [0, 0, 4],
        [40, 11, 84],
        [101, 21, 110],
        [159, 42, 99],
        [212, 72, 66],
        [245, 125, 21],
        [250, 193, 39],
        [252, 255, 164],
    ],
    dtype=np.float64,
)
_LUT = np.stack(
    [np.interp(np.linspace(0, 1, 256), np.linspace(0, 1, len(_ANCHORS)), _ANCHORS[:, c]) for c in range(3)],
    axis=1,
).astype(np.uint8)


def colorize(values: np.ndarray, vmin: float = 0.0, vmax: float = 1.0) -> np.ndarray:
    """(H, W) floats -> (H, W, 3) uint8 colours."""
    scaled = (np.asarray(values, dtype=np.float64) - vmin) / max(vmax - vmin, 1e-12)
    return _LUT[np.clip(np.nan_to_num(scaled * 255.0 + 0.5), 0, 255).astype(np.uint8)]


def heatmap_image(
    grid_values: np.ndarray, size: tuple[int, int], vmin: float = 0.0, vmax: float = 1.0
) -> Image.Image:
    """A (G, G) map as a colour image of `size` (width, height), cells kept crisp."""
    return Image.fromarray(colorize(grid_values, vmin, vmax)).resize(size, Image.Resampling.NEAREST)


OVERLAY_ALPHA = 0.55  # how much of the map shows over the image
OVERLAY_MAX_SIDE = 1024  # overlays are drawn on the image at most this size on a side


def overlay(image: Image.Image, grid_values: np.ndarray, alpha: float = OVERLAY_ALPHA) -> Image.Image:
    """The map blended over the image at the image's own size."""
    base = image.convert("RGB")
    heat = heatmap_image(grid_values, base.size)
    return Image.blend(base, heat, float(np.clip(alpha, 0.0, 1.0)))


def overlay_base(source, side: int = OVERLAY_MAX_SIDE) -> Image.Image:
    """The image an overlay is drawn on: at most `side` on a side, decoded at a fraction of its
    size where the format allows (a 48 MP photo never decodes in full for a picture of 1024 px)."""
    from .images import load_image

    img = load_image(source, side=side)
    img.thumbnail((side, side))
    return img


def selection_mask(selected: np.ndarray, grid: int) -> np.ndarray:
    """(G, G) bool: True on selected cells."""
    mask = np.zeros(grid * grid, dtype=bool)
    mask[np.asarray(selected, dtype=np.int64)] = True
    return mask.reshape(grid, grid)


def homunculus(image: Image.Image, selected: np.ndarray, grid: int, dim: float = 0.25) -> Image.Image:
    """The image with rejected cells dimmed: what the model 'looks at'."""
    base = np.asarray(image.convert("RGB"), dtype=np.float32)
    h, w = base.shape[:2]
    keep = (
        np.asarray(
            Image.fromarray(selection_mask(selected, grid).astype(np.uint8) * 255).resize(
                (w, h), Image.Resampling.NEAREST
            )
        )
        > 127
    )
    out = np.where(keep[..., None], base, base * dim)
    return Image.fromarray(out.astype(np.uint8))


def colormap_hex(n: int = 9) -> list[str]:
    """n evenly spaced colours of the heatmap colour map as '#rrggbb' (for legends and colourbars)."""
    return [
        "#{:02x}{:02x}{:02x}".format(*tuple(int(v) for v in _LUT[i]))
        for i in np.linspace(0, 255, n).astype(int)
    ]


def budget_image(budget_map: np.ndarray, size: tuple[int, int], vmax: float = 400.0) -> Image.Image:
    """Tokens per cell (0 = not selected, shown near-black grey) as a colour image of `size`."""
    values = np.asarray(budget_map, dtype=np.float64)
    rgb = colorize(values, 0.0, vmax)
    rgb[values <= 0] = (24, 24, 32)
    return Image.fromarray(rgb).resize(size, Image.Resampling.NEAREST)


def tint_cells(
    image: Image.Image,
    grid: int,
    layers: list[tuple[np.ndarray, tuple[int, int, int]]],
    alpha: float = 0.55,
    dim: float = 1.0,
) -> Image.Image:
    """The image (other cells multiplied by `dim`) with each (G, G) bool mask tinted in its colour."""
    base = np.asarray(image.convert("RGB"), dtype=np.float32)
    h, w = base.shape[:2]
    painted = np.zeros((grid, grid), dtype=bool)
    colour = np.zeros((grid, grid, 3), dtype=np.float32)
    for mask, rgb in layers:
        colour[mask] = rgb
        painted |= mask
    up = lambda a: np.asarray(Image.fromarray(a).resize((w, h), Image.Resampling.NEAREST))  # noqa: E731
    keep = up(painted.astype(np.uint8) * 255)[..., None] > 127
    col = up(colour.astype(np.uint8)).astype(np.float32)
    out = np.where(keep, base * (1 - alpha) + col * alpha, base * dim)
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8))


CAPTION_BG = (24, 24, 32)  # the caption strip's background: dark, so the colour scale reads on it
CAPTION_MIN_WIDTH = 360  # narrower images get a wider canvas, so the caption stays legible


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # a scalable font where Pillow has FreeType
    except (TypeError, OSError):
        return ImageFont.load_default()


def _fit(draw, text: str, font, width: float) -> str:
    """text, shortened with an ellipsis until it fits `width` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "…", font=font) > width:
        text = text[:-1]
    return text + "…"


def captioned(image: Image.Image, query: str, match_score: float | None, weak: bool) -> Image.Image:
    """The image above a caption strip: the query, its match score ("weak" when weak) and the
    colour scale of the map (low to high, each map scaled to its own peak)."""
    from PIL import ImageDraw

    base = image.convert("RGB")
    w, h = base.size
    width = max(w, CAPTION_MIN_WIDTH)
    fs = max(12, min(22, width // 36))  # font size follows the width, within legible bounds
    pad, bar_h = fs // 2, max(8, fs * 2 // 3)
    strip_h = pad * 4 + fs * 2 + bar_h
    out = Image.new("RGB", (width, h + strip_h), CAPTION_BG)
    out.paste(base, ((width - w) // 2, 0))
    draw = ImageDraw.Draw(out)
    font = _font(fs)
    y = h + pad
    if match_score is None:
        score, colour = "match score: n/a", (200, 200, 210)
    else:
        score = f"match {match_score:.2f}" + (" · weak match" if weak else "")
        colour = (255, 170, 60) if weak else (140, 220, 140)
    score_w = draw.textlength(score, font=font)
    draw.text(
        (pad, y), _fit(draw, f"“{query}”", font, width - score_w - 3 * pad), fill=(240, 240, 245), font=font
    )
    draw.text((width - pad - score_w, y), score, fill=colour, font=font)
    # the colour scale: low on the left, high on the right, labelled at both ends
    y = h + pad * 3 + fs
    low, high = "low", "high relevance (this image's peak)"
    x0 = pad + draw.textlength(low, font=font) + pad
    x1 = width - pad - draw.textlength(high, font=font) - pad
    if x1 - x0 < 16:  # too narrow for words: the bar alone
        x0, x1, low, high = pad, width - pad, "", ""
    ramp = np.broadcast_to(
        _LUT[np.linspace(0, 255, max(1, int(x1 - x0))).astype(int)][None], (bar_h, max(1, int(x1 - x0)), 3)
    )
    bx, by = int(x0), int(y + (fs - bar_h) // 2)
    out.paste(Image.fromarray(np.ascontiguousarray(ramp)), (bx, by))
    draw.rectangle(
        (bx - 1, by - 1, bx + ramp.shape[1], by + bar_h), outline=(110, 110, 125)
    )  # the dark end shows
    draw.text((pad, y), low, fill=(200, 200, 210), font=font)
    draw.text((x1 + pad, y), high, fill=(200, 200, 210), font=font)
    return out


# -- a batch job's overlays, a step at a time (torch tensors, on the engine's device) ---------------
BLEND_PIXELS = 1 << 25  # at most this many pixels blended in one call (its float copy: 4 bytes a channel)


@functools.cache
def nearest_cells(cells: int, pixels: int) -> np.ndarray:
    """For each of `pixels` pixels along a side, the cell (of `cells`) it shows when a map is
    scaled up crisp: Pillow's nearest filter's own choice, so both ways of drawing agree."""
    ramp = Image.fromarray(np.arange(cells, dtype=np.uint8)[None])
    return np.asarray(ramp.resize((pixels, 1), Image.Resampling.NEAREST), dtype=np.int64)[0].copy()


def blend_overlays(views, maps, alpha: float = OVERLAY_ALPHA, max_pixels: int = BLEND_PIXELS) -> list:
    """A step's overlays drawn together: each (G, G) map of `maps` ((B, G, G) floats in [0, 1])
    coloured through the colour table, upsampled crisp (nearest, cell centres) and blended over its
    view ((3, h, w) uint8 tensors, all on one device: the GPU's when the engine is there). Views of
    one shape are drawn in one call. Returns (3, h, w) uint8 tensors on the views' device; the same
    picture as `overlay` up to rounding."""
    import torch

    if not views:
        return []
    device = views[0].device
    lut = torch.from_numpy(_LUT).to(device)  # (256, 3) uint8
    grids = torch.as_tensor(np.asarray(maps, dtype=np.float32)).to(device)
    g = grids.shape[-1]
    # a value that is no number takes the table's first colour: as an index it would be out of
    # range, which on a GPU is a device-side assert that leaves the process's CUDA context unusable
    index = (grids * 255.0 + 0.5).nan_to_num_(0.0).clamp_(0, 255).long()
    heat = lut[index].permute(0, 3, 1, 2)  # (B, 3, G, G) uint8
    out: list = [None] * len(views)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, view in enumerate(views):
        by_shape.setdefault(tuple(view.shape), []).append(i)
    for (_, h, w), idx in by_shape.items():
        rows = torch.from_numpy(nearest_cells(g, h)).to(device)
        cols = torch.from_numpy(nearest_cells(g, w)).to(device)
        per = max(1, max_pixels // (h * w))
        for k in range(0, len(idx), per):
            part = idx[k : k + per]
            up = heat[part][:, :, rows][:, :, :, cols].float()  # (b, 3, h, w)
            mix = torch.stack([views[i] for i in part]).float().mul_(1.0 - alpha).add_(up.mul_(alpha))
            for i, picture in zip(part, mix.round_().clamp_(0, 255).to(torch.uint8), strict=True):
                out[i] = picture
    return out
