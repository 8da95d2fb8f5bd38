"""The three ways of knowing: information, perspectival and participatory scorers.

Each maps a batch to (B, G, G) scores in [0, 1], per image.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .texture import minmax

HIST_BINS = 16


def cell_index_map(size: int, cell: int = 16) -> Tensor:
    """(S*S,) int64: for each pixel (row-major), the row-major index of its cell."""
    grid = size // cell
    rows = torch.arange(size) // cell
    return (rows.view(-1, 1) * grid + rows.view(1, -1)).reshape(-1)


def luminance_entropy(images: Tensor, cell_of_pixel: Tensor | None = None, grid: int | None = None) -> Tensor:
    """Information: Shannon entropy of each cell's 16-bin luminance histogram, over log(16).

    images: uint8 (B, 3, S, S). Luminance and bins are exact integers (computed in float32, which
    holds every value below 2^24 exactly; the bin's division is at least 3.9e-6 away from an
    integer, far more than float32 rounding moves it, even as a multiply by the reciprocal), so
    every backend puts each pixel in the same bin. The histogram is a comparison against the 16
    bin ids, average-pooled over each cell (the pooled one-hot *is* the bin frequencies, k/256
    exactly): a reduction Inductor fuses and ONNX Runtime runs as a comparison and one pool,
    instead of a scatter-add into 16 K counters. `cell_of_pixel` (the old scatter index) is
    accepted and unused.
    """
    p = cell_histogram(images, grid or images.shape[-1] // 16)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(dim=1) / math.log(HIST_BINS)
    return entropy.clamp(0.0, 1.0)


def cell_histogram(images: Tensor, grid: int) -> Tensor:
    """uint8 (B, 3, S, S) -> (B, 16, G, G): each cell's luminance-bin frequencies (count / 256)."""
    s = images.shape[-1]
    px = images.to(torch.float32)
    grey = px[:, 0:1] * 299.0 + px[:, 1:2] * 587.0 + px[:, 2:3] * 114.0  # (B, 1, S, S) in [0, 255000]
    bins = torch.floor(grey * HIST_BINS / 255001.0)  # in [0, 15], the integer bin (tested)
    ids = torch.arange(HIST_BINS, device=images.device, dtype=torch.float32).view(1, HIST_BINS, 1, 1)
    return F.avg_pool2d((bins == ids).to(torch.float32), s // grid)


def channel_softmax_entropy(texture: Tensor) -> Tensor:
    """arr-coc-0-1's information score: entropy of a softmax over the 13 channels, min-max.

    Kept as an option; it mostly measures position, since channels 8-10 dominate.
    """
    p = torch.softmax(texture, dim=1)
    h = -(p * torch.log(p.clamp_min(1e-12))).sum(dim=1)
    return minmax(h)


def salience(texture: Tensor) -> Tensor:
    """Perspectival: edge magnitude (channel 7) and local contrast (channel 12), min-max."""
    return minmax(0.5 * texture[:, 7] + 0.5 * texture[:, 12])


def conv_bmm(x: Tensor, conv: nn.Conv2d) -> Tensor:
    """`conv(x)` for a stride-1, zero-padded 'same' conv, as shifted slices + one batched matmul.

    Why not conv2d: oneDNN picks its kernel by batch size, so an image's features changed in the
    last bits with its batch-mates (~2e-6 once min-max amplified them). A matmul broadcast over the
    batch computes every image the same way. Pad, slice, concat and matmul also export to ONNX.
    """
    b, c, h, w = x.shape
    k, d, p = conv.kernel_size[0], conv.dilation[0], conv.padding[0]
    if k == 1:
        cols = x.flatten(2)  # (B, C, N)
    else:
        xp = F.pad(x, (p, p, p, p))
        taps = [xp[:, :, i * d : i * d + h, j * d : j * d + w] for i in range(k) for j in range(k)]
        cols = torch.cat(taps, dim=1).flatten(2)  # (B, k*k*C, N), tap-major
    weight = conv.weight.permute(0, 2, 3, 1).reshape(conv.out_channels, -1)  # (O, k*k*C), same order
    return (torch.matmul(weight, cols) + conv.bias.view(1, -1, 1)).view(b, -1, h, w)


def row_linear(x: Tensor, linear: nn.Linear) -> Tensor:
    """`linear(x)` for x (B, I) as a broadcast multiply and a sum over I.

    Why not a GEMM: BLAS picks gemv for one row and gemm for many, so a query's FiLM parameters
    changed in the last bits with the batch size. A row-wise sum reduces every row the same way.
    """
    return (x.unsqueeze(1) * linear.weight).sum(-1) + linear.bias


class ParticipatoryScorer(nn.Module):
    """Query coupling: cosine between a per-cell embedding of the texture and the query.

    arr-coc-0-1 used a 1x1-conv MLP, which sees one cell and cannot ground sizes or relations.
    Here three 3x3 convs (dilations 1, 2, 4: a 15x15-cell receptive field) are FiLM-modulated
    by the query. Then every cell is compared with the whole image: its features minus their
    grid mean and grid max ("the largest", "the only red one"), and its position relative to an
    anchor the query points at (a softmax over cells: "the star *left of the green square*").
    All ops are convs, matmuls, softmax and reductions: compile- and ONNX-friendly, no syncs.
    """

    def __init__(self, channels: int = 13, hidden: int = 48, query_dim: int = 384, embed_dim: int = 64):
        super().__init__()
        self.stem = nn.Conv2d(channels, hidden, 3, padding=1)
        self.convs = nn.ModuleList([nn.Conv2d(hidden, hidden, 3, padding=d, dilation=d) for d in (2, 4)])
        self.film = nn.Linear(query_dim, 2 * hidden * 4)
        self.anchor_cells = nn.Conv2d(hidden, embed_dim, 1)
        self.anchor_query = nn.Linear(query_dim, embed_dim)
        self.mix = nn.Conv2d(3 * hidden + 4, hidden, 1)
        self.cell_proj = nn.Conv2d(hidden, embed_dim, 1)
        self.query_proj = nn.Linear(query_dim, embed_dim)
        self.hidden = hidden
        self.embed_dim = embed_dim

    def forward(self, texture: Tensor, query: Tensor) -> Tensor:
        """texture (B, 13, G, G), query (B, Dq) -> scores (B, G, G) in [0, 1]."""
        b, _, g, _ = texture.shape
        film = row_linear(query, self.film).view(b, 4, 2, self.hidden, 1, 1)
        h = F.gelu(conv_bmm(texture, self.stem)) * (1 + film[:, 0, 0]) + film[:, 0, 1]  # (B, H, G, G)
        for i, conv in enumerate(self.convs, start=1):
            h = h + F.gelu(conv_bmm(h, conv)) * (1 + film[:, i, 0]) + film[:, i, 1]
        # anchor: where the query's second object is, as a softmax over cells
        keys = conv_bmm(h, self.anchor_cells).flatten(2)  # (B, E, N)
        logits = torch.einsum("ben,be->bn", keys, row_linear(query, self.anchor_query)) / math.sqrt(
            self.embed_dim
        )
        attn = torch.softmax(logits, dim=-1).unsqueeze(1)  # (B, 1, N)
        pos = texture[:, 8:10]  # (B, 2, G, G): y, x in [0, 1]
        anchor = (attn * pos.flatten(2)).sum(-1).view(b, 2, 1, 1)
        rel = pos - anchor  # (B, 2, G, G): where each cell lies relative to the anchor
        mean = h.mean(dim=(-2, -1), keepdim=True)
        peak = h.amax(dim=(-2, -1), keepdim=True)
        z = torch.cat((h, h - mean, h - peak, 4.0 * rel, rel.abs()), dim=1)
        z = F.gelu(conv_bmm(z, self.mix)) * (1 + film[:, 3, 0]) + film[:, 3, 1]
        cells = F.normalize(conv_bmm(z, self.cell_proj), dim=1)  # (B, E, G, G)
        q = F.normalize(row_linear(query, self.query_proj), dim=-1)  # (B, E)
        cos = torch.einsum("behw,be->bhw", cells, q)
        return (cos + 1.0) * 0.5
