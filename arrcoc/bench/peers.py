"""Two peer scripts: what a competent user writes instead of submitting a batch job, for `arrcoc bench e2e`.

Both read a folder of JPEG photos, run the model the project serves (variant, weights, backend,
dtype and batch size given) with one query, and write each photo's maps and selected cells to a
Parquet file, one row group per batch (no overlays). Timed from the first file read to the Parquet
file closed; loading and warming the model and encoding the query (once, loading the text model)
are not timed.

- `dataloader`: a torch DataLoader whose worker processes decode with Pillow (draft mode, so a large
  JPEG decodes at a fraction of its size) and resize, pinned memory, prefetching, persistent workers;
- `batched`: one process; a thread reads the next batch's files while the current batch runs; the
  batch decodes in one `torchvision.io.decode_jpeg(list, device="cuda")` call (nvJPEG) and resizes
  on the GPU in one call per photo size. On a CPU it decodes with Pillow instead (no nvJPEG there).

    python -m arrcoc.bench.peers batched --photos DIR --out rows.parquet --device cuda --backend compiled --batch 128

prints one JSON line: {"peer", "does", "items", "rows", "wall_s", "images_per_s"}.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from PIL import Image

QUERY = "the red one"
MAPS = ("relevance", "information", "perspectival", "participatory")
PREFETCH = 4  # batches each DataLoader worker keeps ready
FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def load_pipeline(args: argparse.Namespace):
    """The served model, compiled and warmed as the project serves it."""
    from ..engine.base import parse_dtype
    from ..pipeline import RelevancePipeline
    from ..settings import default_settings

    s = default_settings(engine={"device": args.device, "backend": args.backend})
    pipe = RelevancePipeline(
        args.variant,
        args.weights,
        backend=args.backend,
        device=args.device,
        cache_dir=s.service.cache_dir,
        buckets=tuple(b for b in s.engine.buckets if b <= args.batch) or s.engine.buckets[:1],
        dtype=parse_dtype(args.dtype),
    )
    pipe.warmup()
    return pipe


class Rows:
    """results.parquet as a user writes it: a row group per batch, maps as fixed-size lists."""

    def __init__(self, path: Path, k: int):
        self.path, self.k, self.writer, self.count = path, k, None, 0

    def write(self, names: list[str], out) -> None:
        k = self.k
        cols = {"file": pa.array(names, pa.string()), "match_score": pa.array(out.match, pa.float32())}
        for name, ranked in (("selected", out.order), ("budgets", out.budgets)):  # the k selected cells
            flat = pa.array(np.ascontiguousarray(ranked[:, :k], np.int32).reshape(-1))
            cols[name] = pa.FixedSizeListArray.from_arrays(flat, k)
        for name in MAPS:
            grid = getattr(out, name)
            flat = pa.array(np.ascontiguousarray(grid, np.float32).reshape(-1))
            cols[name] = pa.FixedSizeListArray.from_arrays(flat, grid.shape[1] * grid.shape[2])
        table = pa.table(cols)
        self.writer = self.writer or pq.ParquetWriter(self.path, table.schema)
        self.writer.write_table(table)
        self.count += len(names)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def pillow_pixels(source, side: int, resample: str) -> torch.Tensor:
    """A photo as the model takes it: RGB, side x side, uint8 (3, side, side)."""
    with Image.open(source) as img:
        img.draft("RGB", (side, side))  # a JPEG far larger than side decodes at 1/2, 1/4 or 1/8 scale
        rgb = img.convert("RGB").resize((side, side), FILTERS[resample])
    return torch.from_numpy(np.asarray(rgb).transpose(2, 0, 1).copy())


# -- the DataLoader peer ---------------------------------------------------------------------------
class Photos(torch.utils.data.Dataset):
    def __init__(self, paths: list[Path], side: int, resample: str):
        self.paths, self.side, self.resample = paths, side, resample

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, str]:
        return pillow_pixels(self.paths[i], self.side, self.resample), self.paths[i].name


def run_dataloader(pipe, query: torch.Tensor, paths: list[Path], rows: Rows, batch: int, workers: int) -> str:
    cuda = pipe.device.type == "cuda"
    loader = torch.utils.data.DataLoader(
        Photos(paths, pipe.variant.image_size, pipe.resample),
        batch_size=batch,
        num_workers=workers,
        pin_memory=cuda,
        prefetch_factor=PREFETCH,
        persistent_workers=True,
    )
    for images, names in loader:
        out = pipe.backend.run_host(images.to(pipe.device, non_blocking=True), query.expand(len(names), -1))
        rows.write(list(names), out)
    return (
        f"torch DataLoader, {workers} worker processes decoding with Pillow (draft) and resizing,"
        f"{' pinned memory,' if cuda else ''} prefetch {PREFETCH}, persistent workers; batches of {batch}"
    )


# -- the one-process peer --------------------------------------------------------------------------
def gpu_pixels(data: list[torch.Tensor], side: int, resample: str, device: torch.device) -> torch.Tensor:
    """A batch of JPEG files decoded by nvJPEG in one call, resized on the GPU (one call per size)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    decoded = decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
    out = torch.empty((len(decoded), 3, side, side), dtype=torch.uint8, device=device)
    by_size: dict[tuple[int, ...], list[int]] = {}
    for i, img in enumerate(decoded):
        by_size.setdefault(tuple(img.shape), []).append(i)
    for idx in by_size.values():
        x = torch.stack([decoded[i] for i in idx]).float()
        resized = F.interpolate(x, size=(side, side), mode=resample, antialias=True)
        out[idx] = resized.round_().clamp_(0, 255).to(torch.uint8)
    return out


def run_batched(pipe, query: torch.Tensor, paths: list[Path], rows: Rows, batch: int) -> str:
    cuda = pipe.device.type == "cuda"
    side, resample = pipe.variant.image_size, pipe.resample
    batches = [paths[i : i + batch] for i in range(0, len(paths), batch)]
    read = lambda names: [torch.from_numpy(np.fromfile(p, np.uint8)) for p in names]  # noqa: E731
    with ThreadPoolExecutor(1) as reader:
        ahead = reader.submit(read, batches[0]) if batches else None
        for i, names in enumerate(batches):
            data = ahead.result()
            if i + 1 < len(batches):
                ahead = reader.submit(read, batches[i + 1])  # the next batch's files, while this one runs
            if cuda:
                images = gpu_pixels(data, side, resample, pipe.device)
            else:
                images = torch.stack([pillow_pixels(io.BytesIO(d.numpy()), side, resample) for d in data])
            out = pipe.backend.run_host(images, query.expand(len(names), -1))
            rows.write([p.name for p in names], out)
    decode = (
        "torchvision.io.decode_jpeg(list, device='cuda') (nvJPEG), one resize per photo size on the GPU"
        if cuda
        else "Pillow decoding and resizing in the main thread (no nvJPEG on a CPU)"
    )
    return f"one process: a thread reads the next batch's files while the current one runs; {decode}; batches of {batch}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("peer", choices=("dataloader", "batched"))
    p.add_argument("--photos", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="the Parquet file to write")
    p.add_argument("--device", default="auto")
    p.add_argument("--backend", default="eager")
    p.add_argument("--variant", default="arrcoc-texture")
    p.add_argument(
        "--weights", default="default", help="the variant's bundled ones (default), random, or a file"
    )
    p.add_argument("--dtype", default="float32")
    p.add_argument("--batch", type=int, default=128, help="photos per engine call (the job's step)")
    p.add_argument("--workers", type=int, default=max(1, len(os.sched_getaffinity(0)) - 2))
    args = p.parse_args(argv)
    pipe = load_pipeline(args)
    paths = sorted(f for f in args.photos.iterdir() if f.is_file())
    rows = Rows(args.out, pipe.model.config.k)
    # the query encoded before the clock starts, as the served model has its encoder loaded: its
    # first call imports and loads the text model, seconds that are no photo's work
    query = pipe.encoder.encode(QUERY).to(pipe.device)
    t0 = time.perf_counter()
    try:
        if args.peer == "dataloader":
            does = run_dataloader(pipe, query, paths, rows, args.batch, args.workers)
        else:
            does = run_batched(pipe, query, paths, rows, args.batch)
    finally:
        rows.close()
    wall = time.perf_counter() - t0
    does += f" to the {args.backend} model; rows to Parquet with pyarrow, a row group per batch"
    print(
        json.dumps(
            {
                "peer": args.peer,
                "does": does,
                "items": len(paths),
                "rows": rows.count,
                "wall_s": round(wall, 3),
                "images_per_s": round(len(paths) / wall, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
