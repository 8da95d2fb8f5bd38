"""Parity of a backend's outputs against eager: max |diff| per map and the selected sets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..engine.base import ForwardFn
from ..model import ModelOutput

# the output maps held to the tolerance; the 13-channel texture is reported on its own: its
# local-contrast channel (sqrt of E[L^2] - E[L]^2, cancellation-prone) is already ~2.5e-3 off a
# float64 reference in eager float32 itself, so backends differ there by up to ~1e-3
OUTPUT_MAPS = ("relevance", "information", "perspectival", "participatory", "balance", "tensions", "match")
FLOAT_MAPS = OUTPUT_MAPS + ("texture",)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOL = {torch.float32: 1e-3, torch.bfloat16: 6e-2}  # max |diff| on every map, vs fp32 eager
# float32: the selected sets must be identical (up to ties); bfloat16: this share of them
MIN_OVERLAP_BF16 = 0.8
TIE = 1e-4  # cells whose eager relevance is this close to the K-th may swap across the cut


def photo_batch(size: int, batch: int, device: torch.device) -> Tensor:
    """The bundled example photos, resized to size x size, cycled to `batch` rows (uint8)."""
    from ..images import load_image
    from ..preprocess import to_tensor

    photos = [to_tensor(load_image(p), size) for p in sorted(EXAMPLES.glob("*.jpg"))]
    return torch.stack([photos[i % len(photos)] for i in range(batch)]).to(device)


def random_queries(batch: int, dim: int, device: torch.device, seed: int = 0) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(batch, dim, generator=g), dim=-1).to(device)


def selected_sets_agree(ref: ModelOutput, out: ModelOutput, k: Tensor) -> tuple[float, float, float]:
    """(strict, tie-aware) fraction of images whose top-K sets are identical, and the mean
    fraction of selected cells shared. Tie-aware: the cells that differ all have eager
    relevance within TIE of the K-th cell's."""
    strict = ties = 0
    shared = 0.0
    b = ref.order.shape[0]
    for i in range(b):
        kk = int(k[i])
        a, o = set(ref.order[i, :kk].tolist()), set(out.order[i, :kk].tolist())
        shared += len(a & o) / kk
        if a == o:
            strict += 1
            ties += 1
            continue
        rel = ref.relevance[i].flatten().double()
        kth = rel[ref.order[i, kk - 1]]
        if all(abs(float(rel[c] - kth)) <= TIE for c in a ^ o):
            ties += 1
    return strict / b, ties / b, shared / b


def compare(ref: ModelOutput, out: ModelOutput, controls: Tensor) -> dict[str, float]:
    """Max |diff| of every float map, of the token budgets, and top-K agreement."""
    ref = ModelOutput(*(t.detach().cpu() for t in ref))
    out = ModelOutput(*(t.detach().cpu() for t in out))
    diffs = {f: float((getattr(ref, f).double() - getattr(out, f).double()).abs().max()) for f in FLOAT_MAPS}
    strict, ties, shared = selected_sets_agree(ref, out, controls[:, 3].cpu())
    return {
        "max_abs_diff": max(diffs[f] for f in OUTPUT_MAPS),
        "texture_max_diff": diffs["texture"],
        "diff_by_map": diffs,
        "budget_max_diff": float((ref.budget_map - out.budget_map).abs().max()),
        "topk_agreement": strict,
        "topk_agreement_ties": ties,
        "topk_overlap": shared,
        "finite": bool(all(torch.isfinite(t.float()).all() for t in out)),
    }


@dataclass(frozen=True)
class DtypeParity:
    """How far serving in a lower precision moves one model's results from float32's, on the same
    inputs (the figures a report states beside a bfloat16 deployment's speed)."""

    dtype: str
    images: int
    relevance_max_abs_diff: float  # the relevance map, in [0, 1]
    participatory_max_abs_diff: float  # the query's map (CLIP: the per-patch probability)
    maps_max_abs_diff: float  # every output map (OUTPUT_MAPS)
    topk_overlap_mean: float  # share of the K selected cells both select, mean over images
    topk_overlap_min: float  # ... and the worst image
    top1_same: int  # images whose most relevant cell is the same
    match_max_abs_diff: float  # the match score, in [0, 1]
    finite: bool

    def to_json(self) -> dict[str, float | int | str | bool]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def dtype_parity(
    model: nn.Module,
    images: Tensor,
    query: Tensor,
    controls: Tensor | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> DtypeParity:
    """The model's forward in float32 and in `dtype` (autocast, as every engine runs it: ForwardFn)
    on the same uint8 images (B, 3, S, S) and query embeddings (B, Dq), on their device."""
    device = images.device
    controls = model.default_controls(images.shape[0], device) if controls is None else controls.to(device)
    with torch.inference_mode():
        ref = ModelOutput(*ForwardFn(model, device.type, torch.float32)(images, query, controls))
        out = ModelOutput(*ForwardFn(model, device.type, dtype)(images, query, controls))
    ref, out = (ModelOutput(*(t.detach().cpu() for t in o)) for o in (ref, out))
    c = compare(ref, out, controls)
    k = controls[:, 3].long().cpu()
    overlap = [
        len(set(ref.order[i, : k[i]].tolist()) & set(out.order[i, : k[i]].tolist())) / int(k[i])
        for i in range(ref.order.shape[0])
    ]
    return DtypeParity(
        dtype=str(dtype).removeprefix("torch."),
        images=int(images.shape[0]),
        relevance_max_abs_diff=c["diff_by_map"]["relevance"],
        participatory_max_abs_diff=c["diff_by_map"]["participatory"],
        maps_max_abs_diff=c["max_abs_diff"],
        topk_overlap_mean=float(sum(overlap) / len(overlap)),
        topk_overlap_min=float(min(overlap)),
        top1_same=int((ref.order[:, 0] == out.order[:, 0]).sum()),
        match_max_abs_diff=c["diff_by_map"]["match"],
        finite=c["finite"],
    )
