"""The model contract, for every registered variant, and what the trained weights must do."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from arrcoc.errors import InvalidInputError, UnknownVariantError
from arrcoc.model import ModelOutput
from arrcoc.registry import create_model, get_variant, list_variants
from arrcoc.request import Controls, validate_query
from arrcoc.train.scenes import SceneObject, render

torch.set_num_threads(2)
# CLIP variants: weights from the hub and slow on CPU; test_clip.py and test_vit.py hold their contract
FAST_VARIANTS = [
    n for n in list_variants() if "hub" not in get_variant(n).tags and not get_variant(n).benchmark_only
]


def _inputs(model, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    size = model.config.image_size
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8, generator=g)
    query = torch.nn.functional.normalize(torch.randn(batch, 384, generator=g), dim=-1)
    return images, query, model.default_controls(batch)


@pytest.fixture(scope="module")
def trained():
    return create_model("arrcoc-texture")


@pytest.mark.parametrize("name", FAST_VARIANTS)
def test_shapes_and_ranges(name: str) -> None:
    model = create_model(name)
    b, g = 2, model.config.grid
    images, query, controls = _inputs(model, b)
    controls[1, 3], controls[1, 4] = 50, 50 * 64 + 1000  # per-image K and budget
    with torch.no_grad():
        out = model(images, query, controls)
    assert isinstance(out, ModelOutput)
    for m in (out.relevance, out.information, out.perspectival, out.participatory):
        assert m.shape == (b, g, g) and m.min() >= 0 and m.max() <= 1 and torch.isfinite(m).all()
    assert out.texture.shape == (b, 13, g, g)
    assert torch.allclose(out.balance.sum(-1), torch.ones(b), atol=1e-5) and (out.balance >= 0).all()
    assert out.tensions.shape == (b, 3) and ((out.tensions > 0) & (out.tensions < 1)).all()
    assert out.order.shape == (b, g * g) and out.order.dtype == torch.int64
    assert all(torch.equal(out.order[i].sort().values, torch.arange(g * g)) for i in range(b))
    flat = out.relevance.flatten(1)
    assert (flat.gather(1, out.order).diff(dim=1) <= 1e-7).all(), "order is by relevance, highest first"
    for i, (k, total) in enumerate(controls[:, 3:5].tolist()):
        k = int(k)
        chosen = out.budgets[i, :k]
        assert chosen.min() >= 64 and chosen.max() <= 400 and (out.budgets[i, k:] == 0).all()
        assert chosen.sum() <= total + 1e-3
        assert torch.equal(
            out.budget_map[i].flatten().gt(0).nonzero().flatten().sort().values,
            out.order[i, :k].sort().values,
        )


@pytest.mark.parametrize("name", FAST_VARIANTS)
def test_each_image_is_independent_of_its_batch(name: str) -> None:
    model = create_model(name)
    images, query, controls = _inputs(model, 4, seed=1)
    with torch.no_grad():
        together = model(images, query, controls)
        alone = model(images[2:3], query[2:3], controls[2:3])
    for field, a, t in zip(ModelOutput._fields, alone, together, strict=True):
        if a.is_floating_point():
            assert (a[0] - t[2]).abs().max() <= 1e-6, field
        else:
            assert torch.equal(a[0], t[2]), field


def test_zero_graph_breaks(trained) -> None:
    images, query, controls = _inputs(trained, 2)
    explained = torch._dynamo.explain(trained)(images, query, controls)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    compiled = torch.compile(trained, fullgraph=True, backend="eager")
    with torch.no_grad():
        out, ref = compiled(images, query, controls), trained(images, query, controls)
    assert torch.allclose(out.relevance, ref.relevance, atol=1e-5)


def test_no_constant_is_created_in_forward(trained) -> None:
    # every constant is a registered buffer: nothing is copied host->device inside forward
    names = {n for n, _ in trained.named_buffers()}
    assert "cell_of_pixel" in names and any(n.startswith("constants.") for n in names)


# --------------------------------------------------------------------------- query dependence

LAYOUTS = [
    [
        ("circle", "red", 130, 140, 60),
        ("square", "blue", 380, 380, 60),
        ("triangle", "green", 380, 130, 62),
        ("star", "yellow", 130, 390, 66),
    ],
    [
        ("star", "red", 400, 300, 64),
        ("circle", "blue", 120, 120, 56),
        ("square", "green", 140, 380, 58),
        ("triangle", "yellow", 330, 100, 60),
    ],
    [
        ("square", "red", 260, 400, 60),
        ("star", "blue", 260, 120, 70),
        ("circle", "green", 420, 260, 56),
        ("triangle", "yellow", 100, 260, 60),
    ],
]


def _scene(layout, seed: int):
    objs = [SceneObject(k, c, "medium", float(x), float(y), float(r)) for k, c, x, y, r in layout]
    image, masks = render(np.random.default_rng(seed), objs, 512)
    cover = masks.reshape(len(objs), 32, 16, 32, 16).mean(axis=(2, 4)).reshape(len(objs), -1)
    return torch.from_numpy(image).permute(2, 0, 1).contiguous(), cover


def test_query_points_at_the_named_object(trained, query_encoder) -> None:
    hits, total, maps = 0, 0, []
    for seed, layout in enumerate(LAYOUTS):
        image, cover = _scene(layout, seed)
        queries = [f"the {c} {k}" for k, c, *_ in layout]
        q = query_encoder.encode(queries)
        with torch.no_grad():
            out = trained(
                image.expand(len(queries), -1, -1, -1).contiguous(), q, trained.default_controls(len(queries))
            )
        top = out.relevance.flatten(1).argmax(1)
        for i in range(len(queries)):
            hits += int(cover[i, int(top[i])] >= 0.5)
            total += 1
        maps.append(out.relevance)
        # changing the query changes the map (not just the argmax)
        assert (out.relevance[0] - out.relevance[1]).abs().max() > 0.2
    assert hits >= math.ceil(0.9 * total), f"{hits}/{total} queries point at their object"


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "empty"),
        ("   \n\t ", "empty"),
        ("x" * 501, "limit is 500"),
        (42, "must be text"),
        (None, "must be text"),
        ("?!...", "no letters"),
    ],
)
def test_bad_queries_fail_clearly(query, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        validate_query(query)


@pytest.mark.parametrize(
    ("controls", "message"),
    [
        (Controls(k=0), "K must be between 1 and 1024"),
        (Controls(k=5000), "K must be"),
        (Controls(k=200, token_budget=100), "token budget"),
        (Controls(token_budget=10**9), "token budget"),
        (Controls(scale_information=-1), "between 0 and 10"),
        (Controls(scale_perspectival=float("nan")), "between 0"),
        (Controls(0.0, 0.0, 0.0), "above 0"),
    ],
)
def test_bad_controls_fail_clearly(controls: Controls, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        controls.validated(1024, 200, 25600)


def test_unknown_variant_fails_clearly() -> None:
    with pytest.raises(UnknownVariantError, match="Known variants: .*arrcoc-texture"):
        create_model("arrcoc-nope")


def test_match_score_is_the_best_cells_cosine(trained) -> None:
    """Absolute, not normalised per image: the best cell's cosine with the query, clamped to [0, 1]."""
    images, query, controls = _inputs(trained, 3)
    with torch.no_grad():
        out = trained(images, query, controls)
    best_cos = 2.0 * out.participatory.flatten(1).amax(-1) - 1.0
    assert out.match.shape == (3,) and torch.allclose(out.match, best_cos.clamp(0, 1))
