"""The CLIP variants on every backend: registered, zero graph breaks, compiled and ONNX parity
with eager under the same rules as arrcoc-texture (test_engine.py), bfloat16 within its tolerance.

A small random tower (64 wide, 2 layers) keeps CPU compile and export short; the real shapes are
checked against transformers in test_clip.py and timed by `arrcoc bench` (random weights).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from arrcoc.bench.parity import MIN_OVERLAP_BF16, TOL, compare, photo_batch, random_queries
from arrcoc.clip import ClipModelConfig, build_clip
from arrcoc.engine import create_backend
from arrcoc.registry import get_variant, list_variants
from arrcoc.vit import interpolate_positions

CACHE = Path(tempfile.gettempdir()) / "arrcoc-test-vit-cache"
CPU = torch.device("cpu")
BUCKETS = (1, 2)
TINY = ClipModelConfig(hidden=64, heads=2, layers=2, mlp=128, query_dim=32)


@pytest.fixture(scope="module")
def model():
    m = build_clip(TINY, None)
    m.variant_name = "arrcoc-clip-tiny"
    return m


@pytest.fixture(scope="module")
def eager(model):
    be = create_backend("eager", model, CPU, BUCKETS)
    be.warmup()
    return be


def test_clip_variants_are_registered():
    assert {"arrcoc-clip-b16", "arrcoc-clip-b16-448"} <= set(list_variants())
    assert "arrcoc-vit-b16" not in list_variants()  # retired: arrcoc-clip-b16 is its tower with real weights
    for name, grid, k in (("arrcoc-clip-b16", 14, 40), ("arrcoc-clip-b16-448", 28, 160)):
        v = get_variant(name)
        assert (v.grid, v.config.k, v.benchmark_only, v.load is not None) == (grid, k, False, True)


def test_position_interpolation_keeps_the_class_token_and_the_grid():
    w = torch.randn(1 + 14 * 14, 8)
    big = interpolate_positions(w, 28)
    assert big.shape == (1 + 28 * 28, 8) and torch.equal(big[0], w[0])
    assert interpolate_positions(w, 14) is w  # the checkpoint's own grid: untouched
    flat = interpolate_positions(torch.ones(1 + 14 * 14, 3), 28)
    assert torch.allclose(flat, torch.ones_like(flat), atol=1e-6)  # a constant field stays constant


@pytest.mark.slow
def test_forward_has_no_graph_breaks(model):
    images, query = photo_batch(224, 2, CPU), random_queries(2, TINY.query_dim, CPU)
    explained = torch._dynamo.explain(model)(images, query, model.default_controls(2))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["compiled", "onnx"])
def test_backends_match_eager(model, eager, backend):
    be = create_backend(backend, model, CPU, BUCKETS, cache_dir=CACHE / backend)
    be.warmup()
    try:
        for batch in (1, 2, 3):  # every bucket, and 3 = a split (2 + 1)
            images = photo_batch(224, batch, CPU)
            query = random_queries(batch, TINY.query_dim, CPU, seed=batch)
            controls = model.default_controls(batch)
            c = compare(eager.run(images, query, controls), be.run(images, query, controls), controls)
            assert c["finite"] and c["max_abs_diff"] <= TOL[torch.float32], c["diff_by_map"]
            assert c["topk_agreement_ties"] == 1.0 and c["texture_max_diff"] <= 1e-4
        if backend == "compiled":
            assert be.recompiles == 0
    finally:
        be.close()


def test_bf16_within_its_stated_tolerance(model, eager):
    be = create_backend("eager", model, CPU, BUCKETS, torch.bfloat16)
    be.warmup()
    images, query = photo_batch(224, 2, CPU), random_queries(2, TINY.query_dim, CPU)
    controls = model.default_controls(2)
    ref, out = eager.run(images, query, controls), be.run(images, query, controls)
    c = compare(ref, out, controls)
    assert c["finite"] and c["max_abs_diff"] <= TOL[torch.bfloat16], c["diff_by_map"]
    for i in range(2):
        shared = set(ref.order[i, : TINY.k].tolist()) & set(out.order[i, : TINY.k].tolist())
        assert len(shared) >= MIN_OVERLAP_BF16 * TINY.k


def test_an_image_does_not_depend_on_its_batch_mates(model):
    images, query = photo_batch(224, 3, CPU), random_queries(3, TINY.query_dim, CPU)
    with torch.inference_mode():
        together = model(images, query, model.default_controls(3))
        alone = model(images[1:2], query[1:2], model.default_controls(1))
    for a, t in zip(alone, together, strict=True):
        assert (a[0].double() - t[1].double()).abs().max() <= 1e-4
