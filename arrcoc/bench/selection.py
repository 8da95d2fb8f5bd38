"""`arrcoc bench selection`: what the foveated view and the "diverse" selection cost, beside one
compiled step of the model at the same batch (`compiled` backend, CUDA graphs on a GPU).

The "diverse" re-ranking runs inside every step (the static graph computes it for each image and
picks per image), so its cost is timed alone, compiled the way the step is, and given as a share of
the step; the foveated view is timed on the step's own images and budget maps, eager and compiled.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..attending import cell_features, diverse_order
from ..engine import create_backend, resolve_device
from ..engine.base import example_inputs
from ..foveate import DEFAULT_PATCH, foveate
from ..registry import create_model
from .env import collect_env
from .timing import summarize, time_interleaved


def _compiled(fn, device: torch.device):
    # on a GPU a CUDA graph, as the step's own: the share is then kernels, not launches
    return torch.compile(fn, fullgraph=True, mode="reduce-overhead" if device.type == "cuda" else None)


@torch.no_grad()
def bench_selection(device: str = "auto", batch: int = 64, iters: int = 50, warmup: int = 10,
                    variant: str = "arrcoc-texture", cache_dir: Path | None = None, patch: int = DEFAULT_PATCH) -> dict:  # fmt: skip
    dev = resolve_device(device)
    model = create_model(variant, "default", dev).eval()
    backend = create_backend("compiled", model, dev, (batch,), cache_dir=cache_dir)
    backend.warmup()
    images, query, controls = example_inputs(model, batch, dev)
    controls[:, 5] = 1.0  # every image asks for "diverse" (the step computes it either way)
    out = backend.run(images, query, controls)
    relevance = out.relevance.to(dev).flatten(1)
    scores, order = torch.topk(relevance, relevance.shape[1], dim=1)
    features = cell_features(out.texture.to(dev))
    budget_map = out.budget_map.to(dev)
    diverse = _compiled(diverse_order, dev)
    fov = _compiled(foveate, dev)
    calls = {
        "compiled step": lambda i: backend.run(images, query, controls),
        "diverse selection (compiled)": lambda i: diverse(scores, order, features),
        "foveated view (compiled)": lambda i: fov(images, budget_map, patch),
        "foveated view (eager)": lambda i: foveate(images, budget_map, patch),
    }
    times = time_interleaved(calls, iters, warmup, dev)
    rows = {name: summarize(ms) for name, ms in times.items()}
    step = rows["compiled step"]["p50_ms"]
    for row in rows.values():
        row["share_of_step"] = round(row["p50_ms"] / step, 4)
    return {"schema": "arrcoc-bench-selection/1", "env": collect_env(dev), "variant": variant, "batch": batch,
            "image_size": model.config.image_size, "patch": patch, "rows": rows}  # fmt: skip


def markdown(report: dict) -> str:
    lines = [f"Batch {report['batch']} of {report['image_size']} px images, {report['variant']}, patch {report['patch']} px "
             f"({report['env'].get('gpu') or 'cpu'}).", "", "| what | p50 ms | p90 ms | share of the compiled step |",
             "| --- | ---: | ---: | ---: |"]  # fmt: skip
    for name, r in report["rows"].items():
        lines.append(f"| {name} | {r['p50_ms']:.3f} | {r['p90_ms']:.3f} | {r['share_of_step']:.1%} |")
    return "\n".join(lines) + "\n"
