"""Two hand-written peer scripts: what someone would write instead of a batch job, for `arrcoc bench e2e`.

Both read a folder of photos, run the same model on the same backend and device, and write each
image's maps and selected cells as JSON lines (no overlays), timing from the first file read to
the last line written (the model's loading and warm-up excluded):

- `dataloader`: a `torch.utils.data.DataLoader` whose worker processes decode and resize with
  Pillow, batches to the model;
- `batched`: one process reading a batch of files at a time and decoding it in one call
  (`torchvision.io.decode_jpeg(list, device="cuda")` then one resize on a GPU; Pillow on a CPU).

    python -m arrcoc.bench.peers dataloader --photos DIR --out rows.jsonl --device cuda --backend compiled

prints one JSON line: {"peer", "items", "wall_s", "images_per_s"}.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import orjson
import torch
import torch.nn.functional as F
from PIL import Image

QUERY = "the red one"
BATCH = 64


def load_model(device: str, backend: str, variant: str, weights: str, dtype: str):
    from ..engine.base import parse_dtype
    from ..pipeline import RelevancePipeline
    from ..settings import default_settings

    s = default_settings(device=device, backend=backend)
    pipe = RelevancePipeline(
        variant,
        weights,
        backend=backend,
        device=device,
        cache_dir=s.cache_dir,
        buckets=tuple(b for b in s.buckets if b <= BATCH),
        dtype=parse_dtype(dtype),
    )
    pipe.warmup()
    return pipe


def pillow_pixels(path: str, side: int) -> torch.Tensor:
    img = Image.open(path).convert("RGB").resize((side, side), Image.Resampling.BILINEAR)
    return torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy())


class Photos(torch.utils.data.Dataset):
    def __init__(self, paths: list[str], side: int):
        self.paths, self.side = paths, side

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return pillow_pixels(self.paths[i], self.side)


def write_rows(out, names: list[str], result, k: int) -> None:
    """One JSON line per image: its maps and its k selected cells with their budgets."""
    for i, name in enumerate(names):
        out.write(
            orjson.dumps(
                {
                    "file": name,
                    "relevance": result.relevance[i],
                    "information": result.information[i],
                    "perspectival": result.perspectival[i],
                    "participatory": result.participatory[i],
                    "selected": result.order[i, :k],
                    "budgets": result.budgets[i, :k],
                    "match_score": float(result.match[i]),
                },
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
            + b"\n"
        )


def run_dataloader(pipe, paths: list[str], out, workers: int) -> None:
    query = pipe.encoder.encode(QUERY)
    loader = torch.utils.data.DataLoader(
        Photos(paths, pipe.variant.image_size),
        batch_size=BATCH,
        num_workers=workers,
        pin_memory=pipe.device.type == "cuda",
    )
    done = 0
    for images in loader:
        result = pipe.backend.run_host(
            images.to(pipe.device, non_blocking=True), query.expand(len(images), -1)
        )
        write_rows(out, [Path(p).name for p in paths[done : done + len(images)]], result, pipe.model.config.k)
        done += len(images)


def run_batched(pipe, paths: list[str], out) -> None:
    query = pipe.encoder.encode(QUERY)
    side = pipe.variant.image_size
    cuda = pipe.device.type == "cuda"
    for start in range(0, len(paths), BATCH):
        names = paths[start : start + BATCH]
        if cuda:
            from torchvision.io import ImageReadMode, decode_jpeg, read_file

            decoded = decode_jpeg([read_file(p) for p in names], mode=ImageReadMode.RGB, device=pipe.device)
            images = (
                torch.cat(
                    [
                        F.interpolate(img[None].float(), size=(side, side), mode="bilinear", antialias=True)
                        for img in decoded
                    ]
                )
                .round_()
                .clamp_(0, 255)
                .to(torch.uint8)
            )
        else:
            images = torch.stack([pillow_pixels(p, side) for p in names])
        result = pipe.backend.run_host(images, query.expand(len(names), -1))
        write_rows(out, [Path(p).name for p in names], result, pipe.model.config.k)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("peer", choices=("dataloader", "batched"))
    p.add_argument("--photos", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="eager")
    p.add_argument("--variant", default="arrcoc-texture")
    p.add_argument(
        "--weights", default="default", help="the variant's bundled ones (default), random, or a file"
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    args = p.parse_args(argv)
    pipe = load_model(args.device, args.backend, args.variant, args.weights, args.dtype)
    paths = sorted(str(f) for f in args.photos.iterdir() if f.is_file())
    t0 = time.perf_counter()
    with open(args.out, "wb") as out:
        if args.peer == "dataloader":
            run_dataloader(pipe, paths, out, args.workers)
        else:
            run_batched(pipe, paths, out)
    if pipe.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "peer": args.peer,
                "items": len(paths),
                "wall_s": round(wall, 3),
                "images_per_s": round(len(paths) / wall, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
