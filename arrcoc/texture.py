"""Texture array: uint8 images [B, 3, S, S] -> float [B, 13, G, G] (G = S / 16).

Channel order follows arr-coc-0-1:
  0-2   R, G, B in [0, 1]
  3     L* / 100 (CIE L*a*b*, sRGB D65)
  4     (a* + 128) / 255
  5-7   Sobel gx, gy, magnitude of the grey image, min-max normalised per image
  8, 9  y and x in [0, 1]
  10    eccentricity: distance from the centre over its maximum
  11    default: (b* + 128) / 255            compat: copy of 7 (as arr-coc-0-1)
  12    default: local luminance std (per cell, min-max per image)   compat: copy of 3

Default mode averages every feature over its 16x16 cell (area pooling). `compat=True` reproduces
arr-coc-0-1 exactly: bilinear point-sampling to G x G (align_corners=False, no antialias).
Every normalisation is per image, so an image's map never depends on its batch-mates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .configs import CHANNEL_NAMES, COMPAT_CHANNEL_NAMES  # noqa: F401 -- their home is configs.py

CHANNELS = 13

# sRGB (linear) -> XYZ, D65 white point
_RGB_TO_XYZ = (
    (0.4124564, 0.3575761, 0.1804375),
    (0.2126729, 0.7151522, 0.0721750),
    (0.0193339, 0.1191920, 0.9503041),
)
_WHITE_D65 = (0.95047, 1.0, 1.08883)
_GREY = (0.299, 0.587, 0.114)


def minmax(x: Tensor, eps: float = 1e-8) -> Tensor:
    """Min-max normalise each map over its last two dims. x: (B, C, H, W) or (B, H, W)."""
    lo = x.amin(dim=(-2, -1), keepdim=True)
    hi = x.amax(dim=(-2, -1), keepdim=True)
    # clamp, not "+ eps": ONNX export folds "+ 1e-8" away as adding zero (np.allclose's atol)
    return (x - lo) / (hi - lo).clamp_min(eps)


def rgb_to_lab(rgb: Tensor, rgb_to_xyz: Tensor, white: Tensor) -> Tensor:
    """sRGB in [0, 1] (B, 3, H, W) -> CIE L*a*b* (B, 3, H, W)."""
    linear = torch.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055).pow(2.4))
    xyz = torch.einsum("ij,bjhw->bihw", rgb_to_xyz, linear) / white.view(1, 3, 1, 1)
    f = lab_f(xyz)
    fx, fy, fz = f[:, 0], f[:, 1], f[:, 2]
    return torch.stack((116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)), dim=1)


def sobel(grey: Tensor, kernels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """grey (B, 1, H, W) -> gx, gy, magnitude, each (B, 1, H, W). Replicate padding."""
    g = sobel_responses(grey, kernels)
    return g[:, 0:1], g[:, 1:2], edge_magnitude(g)


def sobel_responses(grey: Tensor, kernels: Tensor) -> Tensor:
    """grey (B, 1, H, W) -> (B, 2, H, W): gx, gy in one conv. Replicate padding."""
    return F.conv2d(F.pad(grey, (1, 1, 1, 1), mode="replicate"), kernels)


def edge_magnitude(g: Tensor) -> Tensor:
    """(B, 2, H, W) Sobel responses -> (B, 1, H, W) = sqrt(gx^2 + gy^2 + 1e-8), written so that
    the ONNX exporter cannot drop the 1e-8 as "adding zero" (it did: ONNX Runtime's flat-region
    magnitudes came out 1e-4 lower)."""
    # g * g, not g.square(): exported, square becomes a general Pow (exp and log per element),
    # the top op of ONNX Runtime's CPU profile
    return 1e-4 * torch.sqrt((g * g).sum(dim=1, keepdim=True) * 1e8 + 1.0)


def position_channels(grid: int, device: torch.device | None = None) -> Tensor:
    """(3, G, G): y, x in [0, 1] and eccentricity (distance from the centre / its max)."""
    t = torch.linspace(0.0, 1.0, grid, device=device)
    y, x = torch.meshgrid(t, t, indexing="ij")
    ecc = torch.sqrt((y - 0.5) ** 2 + (x - 0.5) ** 2)
    return torch.stack((y, x, ecc / ecc.max()))


def sobel_kernels() -> Tensor:
    """(2, 1, 3, 3): gx positive where brightness increases rightwards, gy downwards."""
    kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 8.0
    return torch.stack((kx, kx.t())).unsqueeze(1)


class TextureConstants(nn.Module):
    """Every constant the texture maths needs, as buffers: no host->device copy in forward."""

    def __init__(self, grid: int):
        super().__init__()
        self.register_buffer("sobel", sobel_kernels(), persistent=False)
        self.register_buffer("rgb_to_xyz", torch.tensor(_RGB_TO_XYZ), persistent=False)
        self.register_buffer("white", torch.tensor(_WHITE_D65), persistent=False)
        self.register_buffer("grey_weights", torch.tensor(_GREY).view(1, 3, 1, 1), persistent=False)
        # XYZ over the D65 white, in one matrix: (3, 3) @ linear RGB
        self.register_buffer(
            "xyz_over_white",
            torch.tensor(_RGB_TO_XYZ) / torch.tensor(_WHITE_D65).view(3, 1),
            persistent=False,
        )
        self.register_buffer("positions", position_channels(grid), persistent=False)


def cell_variance(x: Tensor, grid: int, mean: Tensor | None = None) -> Tensor:
    """Variance of x (B, 1, S, S) within each of the G x G cells -> (B, 1, G, G).

    Two passes (mean, then mean squared deviation): E[x^2] - E[x]^2 cancels catastrophically in
    flat cells (float32 error up to ~2.5e-3 after the min-max, and different on every backend).
    `mean`: the cell means (B, 1, G, G) when already pooled.
    """
    b, _, s, _ = x.shape
    cells = x.reshape(b, 1, grid, s // grid, grid, s // grid)
    if mean is None:
        mean = cells.mean(dim=(3, 5), keepdim=True)
    else:
        mean = mean.view(b, 1, grid, 1, grid, 1)
    d = cells - mean
    return (d * d).mean(dim=(3, 5))


def lab_f(xyz: Tensor) -> Tensor:
    """CIE's f(t) of XYZ over the white point: cube root, linear near black."""
    delta = 6.0 / 29.0
    return torch.where(xyz > delta**3, xyz.clamp_min(1e-12).pow(1.0 / 3.0), xyz / (3 * delta**2) + 4.0 / 29.0)


def texture_from_float(
    rgb: Tensor, consts: TextureConstants, grid: int, compat: bool
) -> tuple[Tensor, Tensor]:
    """rgb (B, 3, S, S) in [0, 1] -> (texture (B, 13, G, G), grey (B, 1, S, S))."""
    if compat:
        return _texture_compat(rgb, consts, grid)
    b, _, s, _ = rgb.shape
    cell = s // grid
    # Pool as early as the maths allows. Every channel is a cell average, and averaging commutes
    # with anything linear: RGB, the Sobel responses and L*a*b* (linear in f(XYZ)) are pooled at
    # full resolution only once each, and the L*a*b* arithmetic runs on the G x G grid. Only the
    # non-linear steps (sRGB -> linear, f, the edge magnitude) stay per pixel. Inductor fused the
    # old per-pixel form anyway; ONNX Runtime ran every op of it as a separate full-size pass.
    linear = torch.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055).pow(2.4))
    # one (3 x 3) @ (3 x S*S) product per image, the same for every batch size (see knowing.conv_bmm)
    f = lab_f(torch.matmul(consts.xyz_over_white, linear.flatten(2)).view(b, 3, s, s))  # (B, 3, S, S)
    # (a (1 x 3) matmul here, viewed back and replicate-padded, broke Inductor's CPU lowering)
    grey = (rgb * consts.grey_weights).sum(dim=1, keepdim=True)
    g = sobel_responses(grey, consts.sobel)  # (B, 2, S, S)
    # pooled one by one: a concat at full resolution would be one more full-size copy
    pooled_f = F.avg_pool2d(f, cell)  # (B, 3, G, G)
    fx, fy, fz = pooled_f[:, 0:1], pooled_f[:, 1:2], pooled_f[:, 2:3]
    lightness = (116.0 * fy - 16.0) / 100.0
    a_star, b_star = 500.0 * (fx - fy), 200.0 * (fy - fz)
    edges = minmax(torch.cat((F.avg_pool2d(g, cell), F.avg_pool2d(edge_magnitude(g), cell)), dim=1))
    # lightness / 100 = 1.16 f_y - 0.16 per pixel: its cell variance is 1.16^2 that of f_y
    variance = cell_variance(f[:, 1:2], grid, mean=fy) * (1.16**2)
    contrast = minmax(torch.sqrt(variance.clamp_min(1e-12)))
    pos = consts.positions.unsqueeze(0).expand(b, -1, -1, -1)
    return torch.cat(
        (
            F.avg_pool2d(rgb, cell),
            lightness,
            (a_star + 128.0) / 255.0,
            edges,
            pos,
            (b_star + 128.0) / 255.0,
            contrast,
        ),
        dim=1,
    ), grey


def _texture_compat(rgb: Tensor, consts: TextureConstants, grid: int) -> tuple[Tensor, Tensor]:
    """arr-coc-0-1's texture: per-pixel features, point-sampled (bilinear) to the grid."""
    grey = (rgb * consts.grey_weights).sum(dim=1, keepdim=True)
    lab = rgb_to_lab(rgb, consts.rgb_to_xyz, consts.white)
    gx, gy, mag = sobel(grey, consts.sobel)
    full = torch.cat((rgb, lab[:, 0:1] / 100.0, (lab[:, 1:2] + 128.0) / 255.0, gx, gy, mag), dim=1)
    small = F.interpolate(full, size=(grid, grid), mode="bilinear", align_corners=False)
    edges = minmax(small[:, 5:8])
    extra = torch.cat((edges[:, 2:3], small[:, 3:4]), dim=1)
    pos = consts.positions.unsqueeze(0).expand(rgb.shape[0], -1, -1, -1)
    return torch.cat((small[:, 0:5], edges, pos, extra), dim=1), grey


def texture_array(images: Tensor, compat: bool = False) -> Tensor:
    """uint8 images (B, 3, S, S) -> texture array (B, 13, S/16, S/16). Convenience wrapper."""
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected uint8 (B, 3, S, S), got {images.dtype} {tuple(images.shape)}")
    grid = images.shape[-1] // 16
    consts = TextureConstants(grid).to(images.device)
    return texture_from_float(images.float() / 255.0, consts, grid, compat)[0]
