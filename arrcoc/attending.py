"""Allocator: rank every cell, select the top K, give each a token budget (level of detail).

Static shapes: all G*G cells are ranked and budgeted; K and the total budget are per-image
tensors, so one compiled graph serves every K. The host slices the first K.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .request import MAX_CELL_TOKENS, MIN_CELL_TOKENS

MIN_TOKENS = float(MIN_CELL_TOKENS)
MAX_TOKENS = float(MAX_CELL_TOKENS)


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

    def forward(self, relevance: Tensor, k: Tensor, total: Tensor) -> Allocation:
        """relevance (B, G, G) in [0, 1]; k (B,) cells to select; total (B,) token budget."""
        b, g, _ = relevance.shape
        scores, order = torch.topk(relevance.reshape(b, g * g), g * g, dim=1)
        rank = torch.arange(g * g, device=relevance.device, dtype=k.dtype).view(1, -1)
        selected = (rank < k.view(-1, 1)).to(relevance.dtype)
        level = (scores.clamp_min(1e-6).pow(self.gamma()) + self.delta).clamp(0.0, 1.0)
        extra = (MAX_TOKENS - MIN_TOKENS) * level * selected
        room = (total - MIN_TOKENS * k).clamp_min(0.0)
        shrink = (room / extra.sum(dim=1).clamp_min(1e-6)).clamp(max=1.0)
        budgets = torch.floor((MIN_TOKENS + extra * shrink.view(-1, 1)) * selected)
        budget_map = torch.zeros_like(budgets).scatter(1, order, budgets).view(b, g, g)
        return Allocation(order, budgets, budget_map)
