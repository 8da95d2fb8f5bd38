"""Tension balancer (opponent processing): three scorer maps + query -> one relevance map.

Statistics of the maps and the query go through a small MLP to three logits. Three learnable
tensions, each in (0, 1), shape how those logits become weights and how the map is sharpened:
  focus <-> diversify          softmax temperature (focus = sharp weights, diversify = flat)
  exploit <-> explore          mixing with uniform weights (explore = closer to 1/3 each)
  compress <-> particularize   exponent in (1, 3) on the balanced map (compress = few strong cells;
                               never below 1, so the map's slope stays bounded near 0 and an
                               image's map does not amplify float noise from its batch-mates)
They are reported with every result and change it; nothing here is a constant in disguise.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .knowing import row_linear
from .texture import minmax


class Balanced(NamedTuple):
    relevance: Tensor  # (B, G, G) in [0, 1]
    weights: Tensor  # (B, 3), sums to 1: the effective weights after the user's scales
    tensions: Tensor  # (B, 3) in (0, 1), TENSION_NAMES order


def map_statistics(maps: Tensor) -> Tensor:
    """maps (B, 3, G, G) -> (B, 9): mean, max and std of each map."""
    flat = maps.flatten(2)
    return torch.cat((flat.mean(-1), flat.amax(-1), flat.std(-1)), dim=1)


class TensionBalancer(nn.Module):
    def __init__(self, query_dim: int = 384, hidden: int = 64):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(9 + query_dim, hidden), nn.GELU(), nn.Linear(hidden, 3))
        # logits of the tensions; sigmoid(0) = 0.5, a neutral start
        self.tension_logits = nn.Parameter(torch.zeros(3))

    def tensions(self) -> Tensor:
        return torch.sigmoid(self.tension_logits)

    def forward(self, maps: Tensor, query: Tensor, scales: Tensor) -> Balanced:
        """maps (B, 3, G, G) in [0, 1]; query (B, Dq); scales (B, 3) >= 0 (user sliders)."""
        compress, explore, focus = self.tensions().unbind()
        # row-wise linears: an image's weights must not depend on its batch-mates (see knowing.py)
        hidden = F.gelu(row_linear(torch.cat((map_statistics(maps), query), dim=1), self.mlp[0]))
        logits = row_linear(hidden, self.mlp[2])
        temperature = 0.25 + 1.5 * (1.0 - focus)
        weights = (1.0 - explore) * F.softmax(logits / temperature, dim=-1) + explore / 3.0
        weights = weights * scales
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-8)
        combined = (weights.view(-1, 3, 1, 1) * maps).sum(dim=1)
        exponent = 1.0 + 2.0 * compress  # in (1, 3)
        # clamp away from 0: d(x^p)/dp = x^p log x is NaN at 0, and training needs the gradient
        relevance = minmax(combined).clamp(1e-6, 1.0).pow(exponent)
        tensions = torch.stack((compress, explore, focus)).expand(maps.shape[0], 3)
        return Balanced(relevance, weights, tensions)
