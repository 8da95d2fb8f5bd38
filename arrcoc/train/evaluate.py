"""Pointing game: does the top-1 cell of the final relevance map fall inside the named object?

Scored on the cached tensors through the same learnable modules the model's forward uses
(participatory scorer, then balancer with the default scales), so it equals running the whole
model on the scenes' images — tests/test_train.py checks that equivalence.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn

from .data import Dataset

CATEGORIES = ("kind", "colour", "shape", "position", "size")


def relevance_from_fixed(model: nn.Module, texture: Tensor, fixed: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
    """(relevance (B, G, G), participatory (B, G, G)) from cached texture + fixed maps."""
    part = model.participatory(texture, query)
    maps = torch.cat((fixed, part.unsqueeze(1)), dim=1)
    scales = torch.ones(texture.shape[0], 3, device=texture.device, dtype=texture.dtype)
    return model.balancer(maps, query, scales).relevance, part


@torch.no_grad()
def pointing_hits(model: nn.Module, data: Dataset, batch: int = 256) -> tuple[Tensor, Tensor]:
    """(hits of the relevance map (P,) bool, hits of the participatory map alone (P,) bool)."""
    hits, part_hits = [], []
    for start in range(0, len(data), batch):
        sl = slice(start, start + batch)
        scene = data.scene[sl]
        rel, part = relevance_from_fixed(model, data.texture[scene], data.fixed[scene], data.query[sl])
        target = data.hit[sl].flatten(1)
        top = rel.flatten(1).argmax(1, keepdim=True)
        hits.append(target.gather(1, top).squeeze(1))
        part_hits.append(target.gather(1, part.flatten(1).argmax(1, keepdim=True)).squeeze(1))
    return torch.cat(hits).cpu(), torch.cat(part_hits).cpu()


def summarise(hits: Tensor, data: Dataset) -> dict:
    """Overall and per-category accuracy: {"overall": a, "n": P, "by": {cat: {value: {accuracy, n}}}}."""
    out: dict = {"overall": round(float(hits.float().mean()), 4), "n": int(hits.numel()), "by": {}}
    for cat in CATEGORIES:
        groups: dict[str, list[bool]] = defaultdict(list)
        for value, h in zip(data.meta[cat], hits.tolist(), strict=True):
            groups[value].append(h)
        out["by"][cat] = {
            v: {"accuracy": round(sum(g) / len(g), 4), "n": len(g)} for v, g in sorted(groups.items())
        }
    return out


def evaluate(model: nn.Module, data: Dataset) -> dict:
    model.eval()
    hits, part_hits = pointing_hits(model, data)
    result = summarise(hits, data)
    result["participatory_only"] = round(float(part_hits.float().mean()), 4)
    return result
