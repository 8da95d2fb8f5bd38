"""`arrcoc bench selection`: what the foveated view and the "diverse" selection cost, beside one
compiled step of the model at the same batch (`compiled` backend, CUDA graphs on a GPU).

The "diverse" re-ranking runs inside every step (the static graph computes it for each image and
picks per image), so what it costs a step is the step's time less that of the same step with the
re-ranking left out (both compiled and captured alike, timed interleaved). It is also timed alone,
compiled the way the step is. The foveated view is timed on the step's own images and budget maps,
eager and compiled. A function timed alone through torch.compile's own CUDA graphs
("reduce-overhead") is timed with the Python of its call, which on a GPU can outlast its kernels;
the rows marked "CUDA graph" replay it captured on the step's tensors (arrcoc.engine.cuda_graph.
replayer), so they time the device's work alone.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from ..attending import cell_features, diverse_order
from ..engine import create_backend, resolve_device
from ..engine.base import example_inputs
from ..engine.cuda_graph import replayer
from ..foveate import DEFAULT_PATCH, foveate
from ..registry import create_model
from .env import collect_env
from .timing import summarize, time_interleaved

STEP = "compiled step"
STEP_TOP_ONLY = "compiled step without diverse"


class _TopOnly(nn.Module):
    """The model's allocator with the "diverse" re-ranking left out: the step it makes is the
    step less the re-ranking's work."""

    def __init__(self, allocator: nn.Module):
        super().__init__()
        self.inner = allocator

    def forward(self, relevance, k, total, selection=None, features=None):
        return self.inner(relevance, k, total)


def _compiled(fn, device: torch.device):
    # on a GPU torch.compile's own CUDA graphs: what a caller of the compiled function gets
    return torch.compile(fn, fullgraph=True, mode="reduce-overhead" if device.type == "cuda" else None)


def _graphed(fn, inputs: tuple[torch.Tensor, ...]):
    """fn compiled as the step is and captured in a CUDA graph on `inputs`: a replay is its kernels."""
    replay = replayer(torch.compile(fn, fullgraph=True), *inputs)
    return lambda i: replay()


@torch.no_grad()
def bench_selection(
    device: str = "auto",
    batch: int = 64,
    iters: int = 50,
    warmup: int = 10,
    variant: str = "arrcoc-texture",
    cache_dir: Path | None = None,
    patch: int = DEFAULT_PATCH,
) -> dict:
    dev = resolve_device(device)
    model = create_model(variant, "default", dev).eval()
    top_only = copy.deepcopy(model)
    top_only.allocator = _TopOnly(top_only.allocator)
    backend = create_backend("compiled", model, dev, (batch,), cache_dir=cache_dir)
    backend.warmup()
    backend_top = create_backend("compiled", top_only, dev, (batch,), cache_dir=cache_dir)
    backend_top.warmup()
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
        STEP: lambda i: backend.run(images, query, controls),
        STEP_TOP_ONLY: lambda i: backend_top.run(images, query, controls),
        "diverse selection (compiled)": lambda i: diverse(scores, order, features),
        "foveated view (compiled)": lambda i: fov(images, budget_map, patch),
        "foveated view (eager)": lambda i: foveate(images, budget_map, patch),
    }
    if dev.type == "cuda":
        calls["diverse selection (compiled, CUDA graph)"] = _graphed(diverse_order, (scores, order, features))
        calls["foveated view (compiled, CUDA graph)"] = _graphed(
            lambda im, bm: foveate(im, bm, patch), (images, budget_map)
        )
    times = time_interleaved(calls, iters, warmup, dev)
    backend.close()
    backend_top.close()
    rows = {name: summarize(ms) for name, ms in times.items()}
    step = rows[STEP]["p50_ms"]
    for row in rows.values():
        row["share_of_step"] = round(row["p50_ms"] / step, 4)
    # paired per iteration (the calls are interleaved), so drift cancels in each difference
    extra = sorted(a - b for a, b in zip(times[STEP], times[STEP_TOP_ONLY], strict=True))
    in_step = {"p50_ms": extra[len(extra) // 2], "share_of_step": round(extra[len(extra) // 2] / step, 4)}
    return {
        "schema": "arrcoc-bench-selection/2",
        "env": collect_env(dev),
        "variant": variant,
        "batch": batch,
        "image_size": model.config.image_size,
        "patch": patch,
        "rows": rows,
        "diverse_in_step": in_step,
    }


def markdown(report: dict) -> str:
    lines = [
        f"Batch {report['batch']} of {report['image_size']} px images, {report['variant']}, patch {report['patch']} px "
        f"({report['env'].get('gpu') or 'cpu'}).",
        "",
        "| what | p50 ms | p90 ms | share of the compiled step |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, r in report["rows"].items():
        lines.append(f"| {name} | {r['p50_ms']:.3f} | {r['p90_ms']:.3f} | {r['share_of_step']:.1%} |")
    if "diverse_in_step" in report:
        d = report["diverse_in_step"]
        lines.append(
            f"| **diverse selection in the step** (step less the step without it, per iteration) | "
            f"{d['p50_ms']:.3f} | | {d['share_of_step']:.1%} |"
        )
    return "\n".join(lines) + "\n"
