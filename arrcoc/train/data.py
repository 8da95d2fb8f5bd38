"""Training data: scenes -> the small tensors training needs, computed once and cached.

Only the participatory scorer and the balancer learn, so everything else is computed once per
dataset: the texture array and the information/perspectival maps of every scene (through the
model's own `fixed_maps`, so training sees exactly what inference computes), the query embedding
of every caption (the encoder is frozen), and for every caption two targets: the cells the final
relevance map should point at, and the cells the participatory map alone should point at (none
for a caption that asks another way of knowing: "the most detailed part").
A 3000-scene dataset is ~200 MB of float32 instead of ~2.4 GB of images.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from .scenes import KNOWING_OBJECT, SceneConfig, make_scenes

DATA_VERSION = "scenes/9"  # bump when scenes, the fixed maps or the cached tensors change: invalidates caches
HIT_COVERAGE = 0.5  # a cell is "inside" an object when at least half its pixels are the object
# share of cells that a map-defined caption's target takes: "detail" / "salience" the top 2% of
# their map (21 of 1024: at 3% the information map's best cell fell among the perspectival map's
# top cells in 3 scenes of 4, too alike to tell the two apart), "plain" the bottom 5% of their mean
MAP_TARGET_SHARE = {"detail": 0.02, "salience": 0.02, "plain": 0.05}
EDGE_COVERAGE = (0.1, 0.9)  # "the outline of X": cells the object covers partly


@dataclass
class Dataset:
    texture: Tensor  # (N, 13, G, G) float32, one row per scene
    fixed: Tensor  # (N, 2, G, G) information, perspectival
    scene: Tensor  # (P,) int64: the scene of each caption
    query: Tensor  # (P, 384) query embeddings
    hit: Tensor  # (P, G, G) bool: cells that count as pointing at what the caption asks for
    part_hit: Tensor  # (P, G, G) bool: the participatory map's own target (all False: none)
    captions: list[str]  # (P,)
    meta: dict[str, list[str]]  # per caption: kind, colour, shape, position, size ("-" for no object)

    def __len__(self) -> int:
        return int(self.scene.shape[0])

    def to(self, device: torch.device) -> Dataset:
        return Dataset(
            self.texture.to(device),
            self.fixed.to(device),
            self.scene.to(device),
            self.query.to(device),
            self.hit.to(device),
            self.part_hit.to(device),
            self.captions,
            self.meta,
        )

    def subset(self, rows: Tensor) -> Dataset:
        """These captions (the scene tensors are shared)."""
        keep = rows.tolist()
        return Dataset(
            self.texture,
            self.fixed,
            self.scene[rows],
            self.query[rows],
            self.hit[rows],
            self.part_hit[rows],
            [self.captions[i] for i in keep],
            {k: [v[i] for i in keep] for k, v in self.meta.items()},
        )


def hit_cells(masks: np.ndarray, cell: int = 16) -> np.ndarray:
    """masks (n, S, S) bool -> (n, G, G) bool: cells at least half covered by the object.

    A tiny or thin object may cover no cell that much: then its best-covered cells count,
    so every caption has at least one cell to point at.
    """
    n, s, _ = masks.shape
    g = s // cell
    cover = masks.reshape(n, g, cell, g, cell).mean(axis=(2, 4))  # (n, G, G)
    best = cover.reshape(n, -1).max(axis=1).reshape(n, 1, 1)
    return cover >= np.minimum(best, HIT_COVERAGE) - 1e-6


def edge_cells(masks: np.ndarray, cell: int = 16) -> np.ndarray:
    """masks (n, S, S) bool -> (n, G, G) bool: cells the outline passes through (partly covered).

    An object so small that no cell is covered between EDGE_COVERAGE's bounds gets every cell it
    touches but does not fill."""
    n, s, _ = masks.shape
    g = s // cell
    cover = masks.reshape(n, g, cell, g, cell).mean(axis=(2, 4))
    edge = (cover >= EDGE_COVERAGE[0]) & (cover <= EDGE_COVERAGE[1])
    loose = (cover > 0) & (cover < 1)
    return np.where(edge.any(axis=(1, 2), keepdims=True), edge, loose)


def map_target(fixed: Tensor, kinds: list[str]) -> Tensor:
    """fixed (n, 2, G, G) information, perspectival -> (n, G, G) bool targets of map-defined captions.

    detail: the information map's top cells (MAP_TARGET_SHARE); salience: the perspectival map's;
    plain: the cells lowest in their mean (neither detailed nor salient)."""
    maps = {"detail": fixed[:, 0], "salience": fixed[:, 1], "plain": -fixed.mean(dim=1)}
    chosen = torch.stack([maps[k][i] for i, k in enumerate(kinds)]).flatten(1).float()
    cut = torch.stack(
        [torch.quantile(c, 1.0 - MAP_TARGET_SHARE[k]) for c, k in zip(chosen, kinds, strict=True)]
    )
    return (chosen >= cut.view(-1, 1)).view(-1, *fixed.shape[-2:])


_NO_OBJECT = {"colour": "-", "shape": "-", "position": "-", "size": "-"}


def _chunk(
    args: tuple[int, int, SceneConfig],
) -> tuple[np.ndarray, list[tuple[int, np.ndarray | None, np.ndarray, str, dict]]]:
    """Scenes of one chunk: (images (n, 3, S, S) uint8, [(scene in chunk, target cells, participatory
    target cells, caption, meta)]); the target is None where the scorer maps define it (map_target)."""
    n, seed, config = args
    scenes = make_scenes(n, seed, config)
    rows = []
    for j, s in enumerate(scenes):
        cells = hit_cells(s.masks)
        edges = edge_cells(s.masks)
        for text, t, kind in s.captions:
            if t == KNOWING_OBJECT:  # detail, salience, plain: the target comes from the maps
                part = (
                    np.zeros_like(cells[0]) if kind != "plain" else None
                )  # plain: the participatory scorer's job
                rows.append((j, None, part, text, {"kind": kind, **_NO_OBJECT}))
                continue
            o = s.objects[t]
            meta = {
                "kind": kind,
                "colour": o.colour,
                "shape": o.kind,
                "position": " ".join(o.region),
                "size": o.size,
            }
            # "the outline of X": the relevance map points at X's edge cells, the participatory map at X
            rows.append((j, edges[t] if kind == "edges" else cells[t], cells[t], text, meta))
    return np.stack([s.image for s in scenes]).transpose(0, 3, 1, 2), rows


def check_dataset(data: Dataset) -> None:
    """Raise ValueError when a tensor training reads is not finite or a caption has no target cell.

    Either would make the loss or its gradient non-finite, and a single such batch makes every
    parameter non-finite: say which scene or caption it is before training starts."""
    for name in ("texture", "fixed", "query"):
        t = getattr(data, name)
        bad = (~torch.isfinite(t)).flatten(1).any(dim=1).nonzero().flatten()
        if len(bad):
            raise ValueError(f"non-finite {name} in {len(bad)} rows, first {bad[:5].tolist()}")
    empty = (~data.hit.flatten(1).any(dim=1)).nonzero().flatten()
    if len(empty):
        i = int(empty[0])
        raise ValueError(
            f"{len(empty)} captions have no target cell, first {data.captions[i]!r} (scene {int(data.scene[i])})"
        )


def cache_key(n: int, seed: int, config: SceneConfig, model_config: object) -> str:
    scene_spec = asdict(config)
    for key in (
        "extra_phrasings",
        "knowing",
        "colour_regions",
    ):  # options added later: when off, the data is what it was
        if not scene_spec[key]:
            del scene_spec[key]
    spec = json.dumps([DATA_VERSION, n, seed, scene_spec, repr(model_config)], sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


@torch.no_grad()
def build_dataset(
    model,
    encoder,
    n: int,
    seed: int,
    config: SceneConfig,
    chunk: int = 32,
    cache_dir: Path | None = None,
    desc: str = "scenes",
    workers: int = 1,
    progress: bool = True,
) -> Dataset:
    """Generate n scenes, compute their fixed maps and caption embeddings (cached on disk)."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "train" / f"{cache_key(n, seed, config, model.config)}.pt"
        if path.is_file():
            return Dataset(**torch.load(path, weights_only=False))
    device = model.cell_of_pixel.device  # the fixed maps run wherever the model is (GPU if any)
    seeds = [
        int(c.generate_state(1)[0]) for c in np.random.SeedSequence(seed).spawn((n + chunk - 1) // chunk)
    ]
    jobs = [(min(chunk, n - i * chunk), sd, config) for i, sd in enumerate(seeds)]
    textures, fixed, scene_idx, hits, part_hits, captions = [], [], [], [], [], []
    meta: dict[str, list[str]] = {k: [] for k in ("kind", "colour", "shape", "position", "size")}
    done = 0
    # scenes are drawn in worker processes (chunks are seeded independently: same data for any
    # number of workers); the fixed maps are computed here, batched, on the model's device
    pool = mp.get_context("fork").Pool(workers) if workers > 1 else None
    try:
        chunks = pool.imap(_chunk, jobs) if pool else map(_chunk, jobs)
        with tqdm(total=n, desc=desc, unit="scene", leave=False, disable=not progress) as bar:
            for images, rows in chunks:
                tex, fx = model.fixed_maps(torch.from_numpy(images).to(device).contiguous())
                textures.append(tex.cpu())
                fixed.append(fx.cpu())
                from_maps = [(i, r[0], r[4]["kind"]) for i, r in enumerate(rows) if r[1] is None]
                targets = {}
                if from_maps:
                    made = map_target(fx.cpu()[[j for _, j, _ in from_maps]], [k for _, _, k in from_maps])
                    targets = {i: t for (i, _, _), t in zip(from_maps, made, strict=True)}
                for i, (j, cells, part, text, m) in enumerate(rows):
                    scene_idx.append(done + j)
                    hit = targets[i] if cells is None else torch.from_numpy(cells)
                    hits.append(hit)
                    part_hits.append(hit if part is None else torch.from_numpy(part))
                    captions.append(text)
                    for key in meta:
                        meta[key].append(m[key])
                done += images.shape[0]
                bar.update(images.shape[0])
    finally:
        if pool:
            pool.close()
    unique = list(dict.fromkeys(captions))
    vectors = encoder.encode(unique)  # frozen encoder: one pass over the distinct captions
    row = {c: i for i, c in enumerate(unique)}
    data = Dataset(
        texture=torch.cat(textures),
        fixed=torch.cat(fixed),
        scene=torch.tensor(scene_idx),
        query=vectors.cpu()[torch.tensor([row[c] for c in captions])],
        hit=torch.stack(hits),
        part_hit=torch.stack(part_hits),
        captions=captions,
        meta=meta,
    )
    check_dataset(data)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(vars(data), path)
    return data
