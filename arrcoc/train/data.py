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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from .scenes import SceneConfig, make_scenes

DATA_VERSION = "scenes/3"  # bump when scenes or the fixed maps change: invalidates caches
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


def hit_cells(masks: np.ndarray, cell: int = 16) -> Tensor:
    """masks (n, S, S) bool -> (n, G, G) bool: cells at least half covered by the object.

    A tiny or thin object may cover no cell that much: then its best-covered cells count,
    so every caption has at least one cell to point at.
    """
    cover = F.avg_pool2d(torch.from_numpy(masks).float().unsqueeze(1), cell).squeeze(1)  # (n, G, G)
    best = cover.flatten(1).amax(1).view(-1, 1, 1)
    return cover >= torch.minimum(best, torch.tensor(HIT_COVERAGE)) - 1e-6


def cache_key(n: int, seed: int, config: SceneConfig, model_config: object) -> str:
    spec = json.dumps([DATA_VERSION, n, seed, asdict(config), repr(model_config)], sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


@torch.no_grad()
def build_dataset(model, encoder, n: int, seed: int, config: SceneConfig, chunk: int = 32,
                  cache_dir: Path | None = None, desc: str = "scenes") -> Dataset:  # fmt: skip
    """Generate n scenes, compute their fixed maps and caption embeddings (cached on disk)."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / "train" / f"{cache_key(n, seed, config, model.config)}.pt"
        if path.is_file():
            return Dataset(**torch.load(path, weights_only=False))
    device = model.cell_of_pixel.device  # the fixed maps run wherever the model is (GPU if any)
    rng_seed = np.random.SeedSequence(seed)
    textures, fixed, scene_idx, hits, captions = [], [], [], [], []
    meta: dict[str, list[str]] = {k: [] for k in ("kind", "colour", "shape", "position", "size")}
    done = 0
    with tqdm(total=n, desc=desc, unit="scene", leave=False) as bar:
        for child in rng_seed.spawn((n + chunk - 1) // chunk):
            scenes = make_scenes(min(chunk, n - done), int(child.generate_state(1)[0]), config)
            images = torch.from_numpy(np.stack([s.image for s in scenes])).permute(0, 3, 1, 2)
            tex, fx = model.fixed_maps(images.to(device).contiguous())
            textures.append(tex.cpu())
            fixed.append(fx.cpu())
            for j, s in enumerate(scenes):
                cells = hit_cells(s.masks)
                for text, t, kind in s.captions:
                    o = s.objects[t]
                    scene_idx.append(done + j)
                    hits.append(cells[t])
                    captions.append(text)
                    for key, value in (("kind", kind), ("colour", o.colour), ("shape", o.kind),
                                       ("position", " ".join(o.region)), ("size", o.size)):  # fmt: skip
                        meta[key].append(value)
            done += len(scenes)
            bar.update(len(scenes))
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
