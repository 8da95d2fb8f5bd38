"""The foveated view: the picture a vision-language model would be given under a result's budgets.

A selected cell with a budget of b tokens is seen as floor(sqrt(b)) x floor(sqrt(b)) patches of
the VLM's patch size, so at most floor(sqrt(b)) * patch pixels a side, and never more than the
cell's own pixels; an unselected cell is seen at a low base resolution (`base_side` pixels a side).
Each cell is resampled down to what it is given and back up to its own size, and the cells are
composed back at the photo's size. Batched and static in shape: every resolution level the
budgets can ask for is computed for the whole image at once (a handful of levels, fixed by the
image and patch sizes alone) and each cell takes its own level with a `where`, so the same code
runs on the GPU and the CPU with no per-cell Python.

    view = foveate(images, budget_map)          # images (B, 3, H, W), budget_map (B, G, G)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .request import MAX_CELL_TOKENS, MIN_CELL_TOKENS

DEFAULT_PATCH = 14  # pixels a side of one VLM vision token (ViT-L/14, SigLIP-so400m/14); 16 for ViT-*/16
# an unselected cell is kept at 4 x 4 pixels: enough to show what surrounds the selection (a
# 16-px cell of the 512-px model input at a quarter of its resolution), too little to read detail
DEFAULT_BASE_SIDE = 4


def token_side(budget: Tensor) -> Tensor:
    """Patches a side that a budget of b tokens affords: floor(sqrt(b)), 0 for an unselected cell."""
    return torch.floor(torch.sqrt(budget.clamp_min(0.0) + 1e-3))


def _levels(cell_h: int, cell_w: int, patch: int, base_side: int) -> list[tuple[int, int]]:
    """Every (height, width) a cell can be resampled to below its own size, base level first: a
    function of the shapes only, so the graph is the same for every budget map."""
    n_min, n_max = math.isqrt(MIN_CELL_TOKENS), math.isqrt(MAX_CELL_TOKENS)
    sides = [base_side] + [n * patch for n in range(n_min, n_max + 1)]
    out: list[tuple[int, int]] = []
    for s in sides:
        hw = (min(s, cell_h), min(s, cell_w))
        if hw != (cell_h, cell_w) and hw not in out:
            out.append(hw)
    return out


def _taps(cells: int, cell: int, level: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Along one axis of cells * cell pixels: for each pixel, the two samples of the pooled axis
    (cells * level samples) that bilinear interpolation (align_corners=False) of its own cell
    reads, and the second one's weight — F.interpolate's arithmetic, each cell's edges clamped to
    the cell. Shapes only (arange, no copies from the host), so a compiled graph folds them."""
    src = ((torch.arange(cell, device=device, dtype=torch.float32) + 0.5) * (level / cell) - 0.5).clamp_min(
        0.0
    )
    first = src.floor()
    weight = (src - first).repeat(cells)
    first = first.long()
    start = torch.arange(cells, device=device).view(-1, 1) * level
    return (start + first).flatten(), (start + (first + 1).clamp(max=level - 1)).flatten(), weight


def _resampled(x: Tensor, g: int, hw: tuple[int, int]) -> Tensor:
    """x (N, 1, g*ph, g*pw) planes of g x g cells of ph x pw pixels -> every cell averaged down to
    hw and interpolated back up (bilinear) within itself, on the whole plane at once: adaptive
    pooling of the plane to g*hw is the per-cell pooling (no window crosses a cell's edge), and
    each pixel reads only its own cell's samples. No per-cell tensors, no upsampling kernel over
    many tiny planes: a pooling, then gathers and a weighted sum that a compiler fuses into one
    pass over the pixels."""
    cell_h, cell_w = x.shape[-2] // g, x.shape[-1] // g
    out = F.adaptive_avg_pool2d(x, (g * hw[0], g * hw[1]))  # (N, 1, g*lh, g*lw)
    # columns first, on the reduced height, then rows: a gather along the last dimension is the
    # slow one on a CPU, so it runs on the smaller tensor. An axis kept at the cell's own size
    # (a non-square cell) is left as it is.
    if hw[1] != cell_w:
        c0, c1, wx = _taps(g, cell_w, hw[1], x.device)
        left = out[..., c0]  # (N, 1, g*lh, g*pw)
        out = out[..., c1].sub_(left).mul_(wx).add_(left)
    if hw[0] != cell_h:
        r0, r1, wy = _taps(g, cell_h, hw[0], x.device)
        top = out.index_select(2, r0)  # (N, 1, g*ph, g*pw)
        out = out.index_select(2, r1).sub_(top).mul_(wy.view(-1, 1)).add_(top)
    return out


def _per_pixel(cells: Tensor, ch: int, rows: Tensor, cols: Tensor) -> Tensor:
    """(B, G, G) per cell -> (B*ch, 1, H, W) per pixel (rows, cols: each pixel's cell), laid out as
    the planes are (_resampled's input), so that a compiler sees one loop over every pixel of every
    plane and fuses the whole view into it."""
    b, g = cells.shape[0], cells.shape[-1]
    return cells.unsqueeze(1).expand(b, ch, g, g).reshape(b * ch, 1, g, g)[..., cols].index_select(2, rows)


def foveate(
    images: Tensor, budget_map: Tensor, patch: int = DEFAULT_PATCH, base_side: int = DEFAULT_BASE_SIDE
) -> Tensor:
    """images (B, 3, H, W) (uint8 or float); budget_map (B, G, G) tokens per cell, 0 where not
    selected -> the foveated view, (B, 3, H, W) in the images' dtype.

    Cell (r, c) covers rows [r*H/G, (r+1)*H/G) and columns [c*W/G, (c+1)*W/G) of the photo, as
    the model's grid does (the model sees the whole photo squashed to a square). When H and W are
    multiples of G the cells are exact pixel blocks; otherwise the reduced cells are composed on
    the nearest larger multiple and resampled back. Either way a cell whose budget affords its
    own pixels keeps the original pixels (pixel (y, x) is in cell (floor(y*G/H), floor(x*G/W))).
    """
    if images.dim() != 4 or budget_map.dim() != 3 or images.shape[0] != budget_map.shape[0]:
        raise ValueError(
            f"images (B, 3, H, W) and budget_map (B, G, G), got {tuple(images.shape)} and {tuple(budget_map.shape)}"
        )
    if patch < 1 or base_side < 1:
        raise ValueError(f"patch and base_side must be at least 1 pixel, got {patch} and {base_side}")
    b, ch, h, w = images.shape
    g = budget_map.shape[-1]
    ph, pw = -(-h // g), -(-w // g)  # pixels a cell side on the canvas
    exact = (ph * g, pw * g) == (h, w)
    x = images.to(torch.float32)
    if not exact:
        x = F.interpolate(x, size=(ph * g, pw * g), mode="bilinear", align_corners=False)
    x = x.reshape(b * ch, 1, ph * g, pw * g)  # planes: the view treats each channel alike
    side = token_side(budget_map.to(torch.float32)) * patch  # (B, G, G)
    side = torch.where(side > 0, side, torch.full_like(side, float(base_side)))
    want_h, want_w = side.clamp(max=float(ph)), side.clamp(max=float(pw))
    # each canvas pixel's cell, for broadcasting a cell's choice to its pixels (a gather of a (G, G) map)
    rows = torch.arange(ph * g, device=x.device).div(ph, rounding_mode="floor")
    cols = torch.arange(pw * g, device=x.device).div(pw, rounding_mode="floor")
    drawn, own = x, torch.ones_like(want_h, dtype=torch.bool)  # own: the cell keeps its own pixels
    for lh, lw in _levels(
        ph, pw, patch, base_side
    ):  # static: a few levels at most; one where the smallest budget already affords a whole cell
        take = (want_h == lh) & (want_w == lw)  # (B, G, G)
        level = _resampled(x, g, (lh, lw))
        drawn = level if drawn is x else torch.where(_per_pixel(take, ch, rows, cols), level, drawn)
        own = own & ~take
    own = _per_pixel(own, ch, rows, cols)
    if exact:  # the photo's own pixels read from the input itself: no float copy of them is kept
        planes = images.reshape(b * ch, 1, h, w)
        if images.dtype == torch.uint8:
            return torch.where(own, planes, drawn.round().clamp(0, 255).to(torch.uint8)).view(b, ch, h, w)
        return torch.where(own, planes, drawn.to(images.dtype)).view(b, ch, h, w)
    canvas = torch.where(own, x, drawn).view(b, ch, ph * g, pw * g)
    out = F.interpolate(canvas, size=(h, w), mode="bilinear", align_corners=False)
    # back at the photo's size, a cell at full resolution keeps the photo's own pixels
    full = ((want_h >= ph) & (want_w >= pw)).reshape(b, 1, g, g)
    rows = torch.div(torch.arange(h, device=x.device) * g, h, rounding_mode="floor")
    cols = torch.div(torch.arange(w, device=x.device) * g, w, rounding_mode="floor")
    keep = full[:, :, rows][:, :, :, cols]  # (B, 1, H, W): the pixel's cell is at full resolution
    out = torch.where(keep, images.to(torch.float32), out)
    if images.dtype == torch.uint8:
        return out.round().clamp(0, 255).to(torch.uint8)
    return out.to(images.dtype)


# at most this many pixels foveated in one call: each level holds a float copy of the views
VIEW_PIXELS = 1 << 24


def foveate_views(
    views: Sequence[Tensor],
    budget_maps: Tensor,
    patch: int = DEFAULT_PATCH,
    base_side: int = DEFAULT_BASE_SIDE,
    max_pixels: int = VIEW_PIXELS,
) -> list[Tensor]:
    """A batch job's step at once: views ((3, h, w) tensors of any sizes, on one device) and their
    budget maps ((n, G, G)) -> each view foveated, as `foveate` draws it. Views of one shape go
    through one `foveate` call (up to `max_pixels` pixels), so a step costs a call per size, not
    per picture."""
    if not len(views):
        return []
    maps = torch.as_tensor(budget_maps, dtype=torch.float32).to(views[0].device)
    out: list[Tensor | None] = [None] * len(views)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, view in enumerate(views):
        by_shape.setdefault(tuple(view.shape), []).append(i)
    for (_, h, w), idx in by_shape.items():
        per = max(1, max_pixels // (h * w))
        for k in range(0, len(idx), per):
            part = idx[k : k + per]
            drawn = foveate(torch.stack([views[i] for i in part]), maps[part], patch, base_side)
            for i, picture in zip(part, drawn, strict=True):
                out[i] = picture
    return out  # type: ignore[return-value]


def view_tokens(
    budget_map: Tensor,
    image_hw: tuple[int, int],
    patch: int = DEFAULT_PATCH,
    base_side: int = DEFAULT_BASE_SIDE,
) -> Tensor:
    """(B,) the tokens the foveated view really spends: a selected cell min(b, what its own pixels
    fill), an unselected cell its base level, both counted in patches (fractions allowed) — a cell
    smaller than its budget cannot use the rest."""
    h, w = image_hw
    g = budget_map.shape[-1]
    ch, cw = h / g, w / g
    side = token_side(budget_map.to(torch.float32)) * patch
    sel = (side.clamp(max=ch) * side.clamp(max=cw)) / patch**2
    base = min(base_side, ch) * min(base_side, cw) / patch**2
    return torch.where(budget_map > 0, sel, torch.full_like(sel, base)).flatten(1).sum(dim=1)


def uniform_view(images: Tensor, tokens: float, patch: int = DEFAULT_PATCH) -> Tensor:
    """The query-blind baseline at the same token count: the whole image averaged down to about
    `tokens` patches (its aspect kept) and interpolated back to its size."""
    _, _, h, w = images.shape
    rows = max(1, round(math.sqrt(tokens * h / w)))
    cols = max(1, round(tokens / rows))
    size = (min(h, rows * patch), min(w, cols * patch))
    x = images.to(torch.float32)
    out = F.interpolate(F.adaptive_avg_pool2d(x, size), size=(h, w), mode="bilinear", align_corners=False)
    if images.dtype == torch.uint8:
        return out.round().clamp(0, 255).to(torch.uint8)
    return out.to(images.dtype)


# One photo's foveated view is drawn at most this many pixels a side (its aspect kept): each
# resolution level holds a float plane of the view on a canvas of whole cells, so drawing at a
# large photo's own size costs gigabytes, and a photo thinner than the grid has cells, stretched to
# whole cells, costs several times its pixels. 2048 is the size /infer's photos are decoded at (a
# JPEG's draft) and more than a screen shows.
IMAGE_MAX_SIDE = 2048


def working_size(size: tuple[int, int], max_side: int = IMAGE_MAX_SIDE) -> tuple[int, int]:
    """(width, height) a photo of `size` is foveated at: its own, or scaled down to at most
    `max_side` a side (each side at least 1 pixel), as Pillow's thumbnail does."""
    w, h = size
    if max(w, h) <= max_side:
        return w, h
    scale = max_side / max(w, h)
    return max(1, round(w * scale)), max(1, round(h * scale))


def foveated_image(
    image,
    budget_map,
    patch: int = DEFAULT_PATCH,
    base_side: int = DEFAULT_BASE_SIDE,
    max_side: int = IMAGE_MAX_SIDE,
):
    """One PIL image and its (G, G) budget map -> the foveated PIL image, at the photo's size, or
    reduced to at most `max_side` a side (working_size) for a larger photo: whatever the photo,
    the view's work and memory are bounded. Drawn a colour plane at a time (the planes are
    foveated alike), so the float copies are of one plane."""
    import numpy as np
    from PIL import Image

    rgb = image if image.mode == "RGB" else image.convert("RGB")
    size = working_size(rgb.size, max_side)
    if size != rgb.size:
        rgb = rgb.resize(size, Image.Resampling.BOX)
    bm = torch.as_tensor(np.asarray(budget_map), dtype=torch.float32).unsqueeze(0)
    planes = [
        foveate(torch.from_numpy(np.array(band))[None, None], bm, patch, base_side)[0, 0].numpy()
        for band in rgb.split()
    ]
    return Image.merge("RGB", [Image.fromarray(plane) for plane in planes])
