"""Selection measured at equal tokens (`arrcoc eval selection`).

On the training generator's held-out scenes (another seed, held-out phrasings) with their
ground-truth object masks, every way of choosing K cells is scored the same way:

- ARR-COC's relevance ranking ("top") and its "diverse" re-ranking (arrcoc.attending),
- each scorer's map alone (information, perspectival, participatory),
- random cells (seeded),
- and, for fidelity only, uniform downsampling of the whole image to the same token count.

Per query: the **pointing game** (the first selected cell is inside the target), **target
recall at K** (the share of the target's cells among the K selected; a target cell is one the
object covers at least half of, arrcoc.train.data.hit_cells), **objects found at K** (the share of
the named objects with at least one of their cells selected: the figure two-object queries are
about) and the **PSNR inside the target** of the foveated view (arrcoc.foveate) against the
original. Queries: the scenes' object captions, and one two-object query per scene ("the red
circle and the blue square") built from the held-out vocabulary.

Tokens: at the model's 512 px a cell is 16 x 16 pixels, which any budget of 64-400 tokens affords
in full at any VLM patch size, so a selected cell is seen at its own pixels (1 token of 16 px) and
an unselected one at the base level (4 x 4 px, 1/16 token): K cells cost K + (1024 - K) / 16
tokens, and uniform downsampling gets the same number.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor

from ..attending import cell_features, diverse_order
from ..foveate import DEFAULT_BASE_SIDE, foveate, uniform_view, view_tokens
from ..train.data import hit_cells
from ..train.scenes import CAPTION_KINDS, TEXT, SceneConfig, _Words, describe, make_scenes

PSNR_CAP = 60.0  # dB: an exact reconstruction (MSE 0) counts as this, so a mean stays finite
METHODS = (
    "ARR-COC (top)",
    "ARR-COC (diverse)",
    "information only",
    "perspectival only",
    "participatory only",
    "random",
    "uniform downsampling",
)
TWO_OBJECTS = "two objects"


@dataclass(frozen=True)
class SelectionEvalConfig:
    scenes: int = 200  # held-out scenes (about 3 object captions + 1 two-object query each)
    seed: int = (
        0  # the training seed: the scenes come from seed + EVAL_SEED_OFFSET, as `arrcoc train` evaluates
    )
    ks: tuple[int, ...] = (8, 32, 200)  # cells selected (the token counts follow); 200 is the default K
    patch: int = 16  # the VLM's patch size, pixels
    base_side: int = DEFAULT_BASE_SIDE  # pixels a side of an unselected cell
    batch: int = 16  # scenes at a time (with all their queries)


@dataclass
class _Queries:
    scene: list[int]
    text: list[str]
    kind: list[str]  # a CAPTION_KINDS name or TWO_OBJECTS
    objects: list[list[int]]  # the named objects of each query


def _queries(scenes: list, rng_seed: int) -> _Queries:
    """The scenes' object captions, and a two-object query per scene where two objects can be named."""
    q = _Queries([], [], [], [])
    words = _Words(np.random.default_rng(rng_seed), heldout=True)
    for i, s in enumerate(scenes):
        for text, t, kind in s.captions:
            if kind in CAPTION_KINDS and t >= 0:
                q.scene.append(i), q.text.append(text), q.kind.append(kind), q.objects.append([t])
        named = [
            (t, describe(s.objects, t, "colour_shape", words))
            for t in range(len(s.objects))
            if s.objects[t].kind != TEXT
        ]
        named = [(t, d) for t, d in named if d is not None]
        if len(named) >= 2:
            pick = words.rng.choice(len(named), 2, replace=False)
            (a, da), (b, db) = named[pick[0]], named[pick[1]]
            q.scene.append(i), q.text.append(words.frame(f"{da} and {db}")), q.kind.append(TWO_OBJECTS)
            q.objects.append([a, b])
    return q


@dataclass
class _Out:
    relevance: Tensor
    information: Tensor
    perspectival: Tensor
    participatory: Tensor
    texture: Tensor
    order: Tensor


def _outputs(model, texture: Tensor, fixed: Tensor, query: Tensor) -> _Out:
    """The forward's maps and ranking from a scene's cached fixed maps (as `arrcoc train` evaluates,
    tested equal to the whole forward there), at the default scales."""
    from ..train.evaluate import relevance_from_fixed

    relevance, part = relevance_from_fixed(model, texture, fixed, query)
    order = torch.topk(relevance.flatten(1), relevance[0].numel(), dim=1).indices
    return _Out(relevance, fixed[:, 0], fixed[:, 1], part, texture, order)


def _orders(out, generator: torch.Generator) -> dict[str, Tensor]:
    """Each method's ranking of the cells (B, N), first selected first."""
    b = out.relevance.shape[0]
    flat = out.relevance.flatten(1)
    scores = flat.gather(1, out.order)
    rank = lambda m: torch.argsort(m.flatten(1), dim=1, descending=True, stable=True)  # noqa: E731
    n = flat.shape[1]
    return {
        "ARR-COC (top)": out.order,
        "ARR-COC (diverse)": diverse_order(scores, out.order, cell_features(out.texture)),
        "information only": rank(out.information),
        "perspectival only": rank(out.perspectival),
        "participatory only": rank(out.participatory),
        "random": torch.stack([torch.randperm(n, generator=generator) for _ in range(b)]),
    }


def _psnr(mse: Tensor) -> Tensor:
    return (10 * torch.log10(255.0**2 / mse.clamp_min(255.0**2 / 10 ** (PSNR_CAP / 10)))).clamp(max=PSNR_CAP)


@torch.no_grad()
def evaluate_selection(
    model, encoder, cfg: SelectionEvalConfig = SelectionEvalConfig(), progress=None
) -> dict:
    """The report: {"config", "data", "tokens", "results": {group: {method: {metric: value}}}, "seconds"}."""
    from ..train.run import EVAL_SEED_OFFSET

    t0 = time.perf_counter()
    model.eval()
    g = model.config.grid
    n_cells = g * g
    ks = tuple(sorted(cfg.ks))
    if not ks or ks[0] < 1 or ks[-1] > n_cells:
        raise ValueError(f"K must be between 1 and {n_cells}, got {cfg.ks}")
    seed = cfg.seed + EVAL_SEED_OFFSET
    scenes = make_scenes(cfg.scenes, seed, SceneConfig(heldout_phrasing=True))
    queries = _queries(scenes, seed)
    size = model.config.image_size
    cell = size // g
    budget = torch.zeros(len(ks), g, g)
    for j, k in enumerate(ks):
        budget.view(len(ks), -1)[j, :k] = 1.0  # any budget: only selected or not matters at this size
    tokens = view_tokens(budget * 400, (size, size), cfg.patch, cfg.base_side).tolist()
    vec = encoder.encode(queries.text).to(torch.float32)
    gen = torch.Generator().manual_seed(seed)
    rows: dict[str, dict[str, list[Tensor]]] = {m: {} for m in METHODS}
    by_scene = np.asarray(queries.scene)
    for lo in range(0, len(scenes), cfg.batch):  # a chunk of scenes and all their queries
        chunk = scenes[lo : lo + cfg.batch]
        images = torch.from_numpy(
            np.stack([s.image for s in chunk]).transpose(0, 3, 1, 2).copy()
        )  # (n, 3, S, S)
        texture, fixed = model.fixed_maps(
            images
        )  # once per scene: only the participatory map needs the query
        base = foveate(images, torch.zeros(len(chunk), g, g), cfg.patch, cfg.base_side)  # nothing selected
        uniform = [uniform_view(images, t, cfg.patch) for t in tokens]
        qi = np.nonzero((by_scene >= lo) & (by_scene < lo + len(chunk)))[0]
        idx = torch.from_numpy(by_scene[qi] - lo)
        b = len(qi)
        out = _outputs(model, texture[idx], fixed[idx], vec[torch.from_numpy(qi)])
        masks = [scenes[queries.scene[i]].masks[queries.objects[i]] for i in qi]
        target = torch.from_numpy(np.stack([hit_cells(m).any(axis=0) for m in masks])).flatten(1)  # (b, N)
        per_object = [torch.from_numpy(hit_cells(m)).flatten(1) for m in masks]  # [(objects, N)]
        pix = torch.from_numpy(np.stack([m.any(axis=0) for m in masks]))  # (b, S, S)
        imgs = images[idx].float()
        err_px = ((base[idx].float() - imgs) ** 2).sum(1) * pix  # (b, S, S)
        err_cell = err_px.reshape(b, g, cell, g, cell).sum((2, 4)).flatten(1)  # (b, N)
        n_px = pix.flatten(1).sum(1).clamp_min(1) * 3
        for name, order in _orders(out, gen).items():
            got = rows[name]
            got.setdefault("pointing", []).append(target.gather(1, order[:, :1]).squeeze(1).float())
            for k in ks:
                chosen = torch.zeros(b, n_cells, dtype=torch.bool).scatter(1, order[:, :k], True)
                got.setdefault(f"recall@{k}", []).append(
                    (chosen & target).sum(1) / target.sum(1).clamp_min(1)
                )
                found = torch.tensor(
                    [float((objs & chosen[i]).any(1).float().mean()) for i, objs in enumerate(per_object)]
                )
                got.setdefault(f"found@{k}", []).append(found)
                got.setdefault(f"psnr@{k}", []).append(_psnr((err_cell * ~chosen).sum(1) / n_px))
        for k, view in zip(ks, uniform, strict=True):
            mse = (((view[idx].float() - imgs) ** 2).sum(1) * pix).flatten(1).sum(1) / n_px
            rows["uniform downsampling"].setdefault(f"psnr@{k}", []).append(_psnr(mse))
        if progress is not None:
            progress(lo + len(chunk), len(scenes))
    order_of = np.concatenate(
        [
            np.nonzero((by_scene >= lo) & (by_scene < lo + cfg.batch))[0]
            for lo in range(0, len(scenes), cfg.batch)
        ]
    )
    queries = _Queries(
        *([getattr(queries, f)[i] for i in order_of] for f in ("scene", "text", "kind", "objects"))
    )
    kinds = np.array(queries.kind)
    groups = {"object captions": kinds != TWO_OBJECTS, TWO_OBJECTS: kinds == TWO_OBJECTS}
    results: dict = {}
    for group, keep in groups.items():
        keep_t = torch.from_numpy(keep)
        results[group] = {"n": int(keep.sum())}
        for name, metrics in rows.items():
            results[group][name] = {
                m: round(float(torch.cat(v)[keep_t].mean()), 4) for m, v in metrics.items()
            }
    return {
        "config": asdict(cfg),
        "data": {
            "scenes": cfg.scenes,
            "scene_seed": seed,
            "queries": len(queries.text),
            "object_captions": int(groups["object captions"].sum()),
            "two_object_queries": int(groups[TWO_OBJECTS].sum()),
        },
        "tokens": {str(k): round(t, 1) for k, t in zip(ks, tokens, strict=True)},
        "weights_version": getattr(model, "weights_version", "untrained"),
        "results": results,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def to_markdown(report: dict) -> str:
    """The report's tables: per query group, one row per method."""
    ks = [int(k) for k in report["tokens"]]
    lines = [
        f"Held-out scenes: {report['data']['scenes']} (seed {report['data']['scene_seed']}), "
        f"weights `{report['weights_version']}`, patch {report['config']['patch']} px; "
        f"K cells cost " + ", ".join(f"K={k}: {report['tokens'][str(k)]} tokens" for k in ks) + "."
    ]
    for group, res in report["results"].items():
        lines += ["", f"**{group}** ({res['n']} queries)", ""]
        head = (
            ["method", "pointing"]
            + [f"recall@{k}" for k in ks]
            + [f"found@{k}" for k in ks]
            + [f"PSNR@{k} dB" for k in ks]
        )
        lines += ["| " + " | ".join(head) + " |", "| --- " + "| ---: " * (len(head) - 1) + "|"]
        for name in METHODS:
            m = res[name]
            cell = lambda key, fmt="{:.3f}", m=m: fmt.format(m[key]) if key in m else "—"  # noqa: E731
            row = (
                [name, cell("pointing")]
                + [cell(f"recall@{k}") for k in ks]
                + [cell(f"found@{k}") for k in ks]
            )
            row += [cell(f"psnr@{k}", "{:.2f}") for k in ks]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
