"""Training data: scenes -> the small tensors training needs, computed once and cached.

Only the participatory scorer and the balancer learn, so everything else is computed once per
dataset: the texture array and the information/perspectival maps of every scene (through the
model's own `fixed_maps`, so training sees exactly what inference computes), the query embedding
of every caption (the encoder is frozen), and for every caption the cells of its object.
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

from .scenes import SceneConfig, make_scenes

DATA_VERSION = "scenes/7"  # bump when scenes or the fixed maps change: invalidates caches
HIT_COVERAGE = 0.5  # a cell is "inside" an object when at least half its pixels are the object


@dataclass
class Dataset:
    texture: Tensor  # (N, 13, G, G) float32, one row per scene
    fixed: Tensor  # (N, 2, G, G) information, perspectival
    scene: Tensor  # (P,) int64: the scene of each caption
    query: Tensor  # (P, 384) query embeddings
    hit: Tensor  # (P, G, G) bool: cells that count as pointing at the caption's object
    captions: list[str]  # (P,)
    meta: dict[str, list[str]]  # per caption: kind, colour, shape, position, size

    def __len__(self) -> int:
        return int(self.scene.shape[0])

    def to(self, device: torch.device) -> Dataset:
        return Dataset(self.texture.to(device), self.fixed.to(device), self.scene.to(device),
                       self.query.to(device), self.hit.to(device), self.captions, self.meta)  # fmt: skip


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


def _chunk(args: tuple[int, int, SceneConfig]) -> tuple[np.ndarray, list[tuple[int, np.ndarray, str, dict]]]:
    """Scenes of one chunk: (images (n, 3, S, S) uint8, [(scene in chunk, hit cells, caption, meta)])."""
    n, seed, config = args
    scenes = make_scenes(n, seed, config)
    rows = []
    for j, s in enumerate(scenes):
        cells = hit_cells(s.masks)
        for text, t, kind in s.captions:
            o = s.objects[t]
            meta = {"kind": kind, "colour": o.colour, "shape": o.kind, "position": " ".join(o.region), "size": o.size}
            rows.append((j, cells[t], text, meta))
    return np.stack([s.image for s in scenes]).transpose(0, 3, 1, 2), rows


def cache_key(n: int, seed: int, config: SceneConfig, model_config: object) -> str:
    scene_spec = asdict(config)
    if not scene_spec["extra_phrasings"]:  # added after scenes/7 without changing its data: keys stay valid
        del scene_spec["extra_phrasings"]
    spec = json.dumps([DATA_VERSION, n, seed, scene_spec, repr(model_config)], sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


@torch.no_grad()
def build_dataset(model, encoder, n: int, seed: int, config: SceneConfig, chunk: int = 32,
                  cache_dir: Path | None = None, desc: str = "scenes", workers: int = 1, progress: bool = True) -> Dataset:  # fmt: skip
    """Generate n scenes, compute their fixed maps and caption embeddings (cached on disk)."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "train" / f"{cache_key(n, seed, config, model.config)}.pt"
        if path.is_file():
            return Dataset(**torch.load(path, weights_only=False))
    device = model.cell_of_pixel.device  # the fixed maps run wherever the model is (GPU if any)
    seeds = [int(c.generate_state(1)[0]) for c in np.random.SeedSequence(seed).spawn((n + chunk - 1) // chunk)]
    jobs = [(min(chunk, n - i * chunk), sd, config) for i, sd in enumerate(seeds)]
    textures, fixed, scene_idx, hits, captions = [], [], [], [], []
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
                for j, cells, text, m in rows:
                    scene_idx.append(done + j)
                    hits.append(torch.from_numpy(cells))
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
        texture=torch.cat(textures), fixed=torch.cat(fixed), scene=torch.tensor(scene_idx),
        query=vectors.cpu()[torch.tensor([row[c] for c in captions])], hit=torch.stack(hits),
        captions=captions, meta=meta,
    )  # fmt: skip
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(vars(data), path)
    return data
