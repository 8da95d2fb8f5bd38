"""Pointing game: does the top-1 cell of the final relevance map fall inside the named object (or,
for the other ways of knowing, inside the cells the caption asks for)? And the balancer's weights
over the captions, by kind: which way of knowing answers which query.

Scored on the cached tensors through the same learnable modules the model's forward uses
(participatory scorer, then balancer with the default scales), so it equals running the whole
model on the scenes' images — tests/test_train.py checks that equivalence.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor, nn

from ..balancing import Balanced
from ..result import SCORER_NAMES
from .data import Dataset
from .scenes import CAPTION_KINDS, KNOWING_KINDS, REGION

CATEGORIES = ("kind", "colour", "shape", "position", "size")


def balanced_from_fixed(
    model: nn.Module, texture: Tensor, fixed: Tensor, query: Tensor, detach_part: Tensor | None = None
) -> tuple[Balanced, Tensor]:
    """(the balancer's output, participatory (B, G, G)) from cached texture + fixed maps, with the
    default scales. detach_part (B,) bool: rows whose participatory map the balanced map may not train."""
    part = model.participatory(texture, query)
    balanced_part = (
        part if detach_part is None else torch.where(detach_part.view(-1, 1, 1), part.detach(), part)
    )
    maps = torch.cat((fixed, balanced_part.unsqueeze(1)), dim=1)
    scales = torch.ones(texture.shape[0], 3, device=texture.device, dtype=texture.dtype)
    return model.balancer(maps, query, scales), part


def relevance_from_fixed(
    model: nn.Module, texture: Tensor, fixed: Tensor, query: Tensor, detach_part: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(relevance (B, G, G), participatory (B, G, G)) from cached texture + fixed maps."""
    balanced, part = balanced_from_fixed(model, texture, fixed, query, detach_part)
    return balanced.relevance, part


@torch.no_grad()
def pointing_hits(model: nn.Module, data: Dataset, batch: int = 256) -> tuple[Tensor, Tensor, Tensor]:
    """(hits of the relevance map (P,) bool, hits of the participatory map alone (P,) bool against
    its own target, balancer weights (P, 3) in SCORER_NAMES order)."""
    hits, part_hits, weights = [], [], []
    for start in range(0, len(data), batch):
        sl = slice(start, start + batch)
        scene = data.scene[sl]
        balanced, part = balanced_from_fixed(model, data.texture[scene], data.fixed[scene], data.query[sl])
        top = balanced.relevance.flatten(1).argmax(1, keepdim=True)
        hits.append(data.hit[sl].flatten(1).gather(1, top).squeeze(1))
        part_hits.append(
            data.part_hit[sl].flatten(1).gather(1, part.flatten(1).argmax(1, keepdim=True)).squeeze(1)
        )
        weights.append(balanced.weights.float())
    return torch.cat(hits).cpu(), torch.cat(part_hits).cpu(), torch.cat(weights).cpu()


def _accuracy(hits: list[bool]) -> dict:
    return {"accuracy": round(sum(hits) / len(hits), 4), "n": len(hits)}


def summarise(hits: Tensor, data: Dataset) -> dict:
    """{"overall": a, "n": P, "by": {cat: {value: {accuracy, n}}}} over the object captions
    (CAPTION_KINDS: the figure earlier reports gave), "by" "kind" over every kind, and
    "all_captions" over every caption (the other ways of knowing included)."""
    kinds = data.meta["kind"]
    objects = [k in CAPTION_KINDS for k in kinds]
    flags = hits.tolist()
    object_hits = [h for h, o in zip(flags, objects, strict=True) if o]
    out: dict = {
        "overall": round(sum(object_hits) / max(1, len(object_hits)), 4),
        "n": len(object_hits),
        "by": {},
    }
    for cat in CATEGORIES:
        groups: dict[str, list[bool]] = defaultdict(list)
        for value, h, o in zip(data.meta[cat], flags, objects, strict=True):
            if o or cat == "kind":
                groups[value].append(h)
        out["by"][cat] = {v: _accuracy(g) for v, g in sorted(groups.items())}
    out["all_captions"] = _accuracy(flags) if flags else {"accuracy": 0.0, "n": 0}
    return out


def balance_summary(weights: Tensor, kinds: list[str]) -> dict:
    """The balancer's three weights over captions, by kind and over all:
    {group: {"n", scorer: {mean, std, p10, p50, p90}, "largest": {scorer: share of captions}}}."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(kinds):
        groups[k].append(i)
        if k != REGION:  # a colour region is neither an object nor another way of knowing
            groups["objects (all kinds)" if k in CAPTION_KINDS else "other ways (all kinds)"].append(i)
        groups["all captions"].append(i)
    out = {}
    for g, rows in groups.items():
        w = weights[torch.tensor(rows)]
        q = torch.quantile(w, torch.tensor([0.1, 0.5, 0.9]), dim=0)
        largest = torch.bincount(w.argmax(1), minlength=3).float() / len(rows)
        out[g] = {"n": len(rows)}
        for j, name in enumerate(SCORER_NAMES):
            out[g][name] = {
                "mean": round(float(w[:, j].mean()), 4),
                "std": round(float(w[:, j].std(unbiased=False)), 4),
                "p10": round(float(q[0, j]), 4),
                "p50": round(float(q[1, j]), 4),
                "p90": round(float(q[2, j]), 4),
            }
        out[g]["largest"] = {name: round(float(largest[j]), 4) for j, name in enumerate(SCORER_NAMES)}
    order = [
        *CAPTION_KINDS,
        "objects (all kinds)",
        REGION,
        *KNOWING_KINDS,
        "other ways (all kinds)",
        "all captions",
    ]
    return {g: out[g] for g in order if g in out}


def evaluate(model: nn.Module, data: Dataset) -> dict:
    model.eval()
    hits, part_hits, weights = pointing_hits(model, data)
    result = summarise(hits, data)
    objects = torch.tensor([k in CAPTION_KINDS for k in data.meta["kind"]])
    result["participatory_only"] = (
        round(float(part_hits[objects].float().mean()), 4) if objects.any() else 0.0
    )
    result["balance"] = balance_summary(weights, data.meta["kind"])
    return result
