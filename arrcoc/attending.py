"""Allocator: rank every cell, select the top K, give each a token budget (level of detail).

Static shapes: all G*G cells are ranked and budgeted; K and the total budget are per-image
tensors, so one compiled graph serves every K. The host slices the first K.

Two rankings, chosen per image (Controls.selection): "top" ranks by relevance alone; "diverse"
re-ranks the most relevant cells so that a cell much like a more relevant one (near it and of
its colour) steps back and the peaks of other regions come forward — the relevance-weighted
max-min of density-peak clustering (Rodriguez & Laio, Science 2014): a cell keeps its relevance
in full only when no more relevant cell is within DIVERSE_RADIUS of it in (position, colour),
and DIVERSE_FLOOR of it when one is right beside it.
Every more relevant cell of a candidate is itself a candidate, so the distances among the
DIVERSE_CANDIDATES best cells are exact; cells past them keep their relevance order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .request import MAX_CELL_TOKENS, MIN_CELL_TOKENS

MIN_TOKENS = float(MIN_CELL_TOKENS)
MAX_TOKENS = float(MAX_CELL_TOKENS)

# "diverse": candidates re-ranked (a static share of the grid, so the pairwise distances stay a
# (C, C) matrix per image); how far in (y, x, L*, a*, b*) a more relevant cell stops weighing on a
# cell (positions in [0, 1], colour in units of 100 L*a*b*: 0.2 is about 6 cells, or a colour
# difference of 20); and the share of its relevance a cell next to a more relevant look-alike keeps
DIVERSE_CANDIDATES = 256
DIVERSE_RADIUS = 0.2
DIVERSE_FLOOR = 0.5
# texture channels of a cell's (y, x, L*, a*, b*) and their scales to the units above (arrcoc/texture.py)
_FEATURE_CHANNELS = (8, 9, 3, 4, 11)
_FEATURE_SCALES = (1.0, 1.0, 1.0, 2.55, 2.55)


def cell_features(texture: Tensor) -> Tensor:
    """texture (B, 13, G, G) -> (B, G*G, 5): each cell's position and colour for "diverse"."""
    # python scalars and slices, no index or scale tensors: nothing is copied to the device in forward
    f = torch.stack(
        [texture[:, ch] * sc for ch, sc in zip(_FEATURE_CHANNELS, _FEATURE_SCALES, strict=True)], dim=-1
    )
    return f.flatten(1, 2)


def diverse_order(
    scores: Tensor, order: Tensor, features: Tensor, candidates: int = DIVERSE_CANDIDATES
) -> Tensor:
    """scores, order (B, N) relevance ranking (highest first); features (B, N, D) -> (B, N) the
    "diverse" order. Static shapes and no data-dependent control flow (compiles and exports)."""
    b, n = order.shape
    c = min(candidates, n)
    cand = order[:, :c]
    f = features.gather(1, cand.unsqueeze(-1).expand(-1, -1, features.shape[-1]))  # (B, C, D)
    sq = (f * f).sum(-1)
    d2 = (sq.unsqueeze(2) + sq.unsqueeze(1) - 2.0 * torch.bmm(f, f.transpose(1, 2))).clamp_min(
        0.0
    )  # (B, C, C)
    rank = torch.arange(c, device=order.device)
    earlier = rank.view(1, c) < rank.view(c, 1)  # [i, j]: j ranks above i
    # squared distance over the radius squared: a cell a step or two from a better look-alike keeps
    # little more than the floor, so a noisy plateau does not read as many peaks
    nearest2 = torch.where(earlier, d2, torch.full_like(d2, DIVERSE_RADIUS**2)).amin(dim=2)
    apart = (nearest2 / DIVERSE_RADIUS**2).clamp(max=1.0)
    weighted = scores[:, :c] * (DIVERSE_FLOOR + (1.0 - DIVERSE_FLOOR) * apart)
    _, pick = torch.topk(weighted, c, dim=1)
    return torch.cat((cand.gather(1, pick), order[:, c:]), dim=1)


class Allocation(NamedTuple):
    order: Tensor  # (B, N) int64: cell indices, most relevant first
    budgets: Tensor  # (B, N) float: tokens of the cell at each rank, 0 past K
    budget_map: Tensor  # (B, G, G) float: tokens per cell, 0 where not selected


class TokenAllocator(nn.Module):
    """budget = 64 + 336 * clamp(s^gamma + delta, 0, 1), scaled down to fit the total."""

    def __init__(self):
        super().__init__()
        self.gamma_raw = nn.Parameter(torch.tensor(0.5413))  # softplus -> 1.0
        self.delta = nn.Parameter(torch.tensor(0.0))

    def gamma(self) -> Tensor:
        return F.softplus(self.gamma_raw)

    def forward(
        self,
        relevance: Tensor,
        k: Tensor,
        total: Tensor,
        selection: Tensor | None = None,
        features: Tensor | None = None,
    ) -> Allocation:
        """relevance (B, G, G) in [0, 1]; k (B,) cells to select; total (B,) token budget;
        selection (B,) 1 where the image asks for "diverse" (then features (B, G*G, D), see
        cell_features), 0 for "top"."""
        b, g, _ = relevance.shape
        flat = relevance.reshape(b, g * g)
        scores, order = torch.topk(flat, g * g, dim=1)
        if selection is not None and features is not None:
            diverse = diverse_order(scores, order, features)
            order = torch.where(selection.view(-1, 1) > 0.5, diverse, order)
            scores = flat.gather(1, order)
        rank = torch.arange(g * g, device=relevance.device, dtype=k.dtype).view(1, -1)
        selected = (rank < k.view(-1, 1)).to(relevance.dtype)
        level = (scores.clamp_min(1e-6).pow(self.gamma()) + self.delta).clamp(0.0, 1.0)
        extra = (MAX_TOKENS - MIN_TOKENS) * level * selected
        room = (total - MIN_TOKENS * k).clamp_min(0.0)
        shrink = (room / extra.sum(dim=1).clamp_min(1e-6)).clamp(max=1.0)
        budgets = torch.floor((MIN_TOKENS + extra * shrink.view(-1, 1)) * selected)
        budget_map = torch.zeros_like(budgets).scatter(1, order, budgets).view(b, g, g)
        return Allocation(order, budgets, budget_map)
