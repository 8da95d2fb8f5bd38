"""Training: scenes are seeded and well-formed; a tiny run is reproducible and writes its report."""

from __future__ import annotations

import colorsys
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from arrcoc.registry import create_model
from arrcoc.train.data import _chunk, build_dataset, check_dataset, edge_cells, hit_cells, map_target
from arrcoc.train.evaluate import evaluate, relevance_from_fixed
from arrcoc.train.run import reevaluate, report_paths, run_training
from arrcoc.train.scenes import (
    CAPTION_KINDS,
    HELDOUT_FRAMES,
    KNOWING_KINDS,
    KNOWING_OBJECT,
    KNOWING_WORDS,
    TRAIN_FRAMES,
    SceneConfig,
    make_scenes,
)
from arrcoc.train.trainer import TrainConfig, make_step, pointing_loss, seed_everything, train

torch.set_num_threads(2)


def test_scenes_are_seeded_and_well_formed() -> None:
    a, b = make_scenes(6, 7), make_scenes(6, 7)
    assert all(
        np.array_equal(x.image, y.image) and x.captions == y.captions for x, y in zip(a, b, strict=True)
    )
    assert not np.array_equal(a[0].image, make_scenes(1, 8)[0].image)
    for s in a:
        assert s.image.shape == (512, 512, 3) and s.image.dtype == np.uint8
        assert s.masks.shape == (len(s.objects), 512, 512) and s.masks.any(axis=(1, 2)).all()
        assert not (s.masks.sum(0) > 1).any(), "objects do not overlap"
        assert 1 <= len(s.captions) <= 3 and len({t for _, t, _ in s.captions}) == len(s.captions)
        assert hit_cells(s.masks).any(axis=(1, 2)).all(), "every object has a cell to point at"


def test_heldout_phrasings_are_not_training_phrasings() -> None:
    assert not set(TRAIN_FRAMES) & set(HELDOUT_FRAMES)
    held = [c for s in make_scenes(20, 3, SceneConfig(heldout_phrasing=True)) for c, _, _ in s.captions]
    prefixes = tuple(f.split("{d}")[0] for f in HELDOUT_FRAMES if f.split("{d}")[0])
    assert all(
        c.startswith(prefixes) or c.endswith((", please", "?")) or c.startswith("I want") for c in held
    )


@pytest.fixture(scope="module")
def tiny(query_encoder):
    seed_everything(0)
    model = create_model("arrcoc-texture", weights=None)
    return model, build_dataset(model, query_encoder, 6, 0, SceneConfig(knowing=3), progress=False)


def test_cached_path_equals_the_model_forward(tiny) -> None:
    # training and the pointing game run on cached tensors: they must equal the real forward
    model, data = tiny
    seed = int(np.random.SeedSequence(0).spawn(1)[0].generate_state(1)[0])  # build_dataset's first chunk
    images, _ = _chunk((6, seed, SceneConfig(knowing=3)))
    rows = torch.arange(min(4, len(data)))
    scene = data.scene[rows]
    with torch.no_grad():
        rel, _ = relevance_from_fixed(model, data.texture[scene], data.fixed[scene], data.query[rows])
        out = model(
            torch.from_numpy(images)[scene].contiguous(), data.query[rows], model.default_controls(len(rows))
        )
    assert torch.allclose(out.texture, data.texture[scene], atol=1e-6)
    assert torch.allclose(out.relevance, rel, atol=1e-6)


def test_training_is_reproducible(tiny) -> None:
    _, data = tiny
    cfg = TrainConfig(steps=3, batch=4, seed=5, threads=2)
    states = []
    for seed in (5, 5, 6):
        seed_everything(0)
        model = create_model("arrcoc-texture", weights=None)
        train(model, data, TrainConfig(**{**cfg.__dict__, "seed": seed}), progress=False)
        states.append(model.state_dict())
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0]), "same seed -> identical weights"
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0]), (
        "another seed -> other weights"
    )
    init = create_model("arrcoc-texture", weights=None).state_dict()
    assert not torch.equal(states[0]["participatory.stem.weight"], init["participatory.stem.weight"])


def test_a_non_finite_batch_is_skipped_not_spread_to_every_weight(tiny) -> None:
    # one NaN input makes the clipping norm NaN, and clipping then turns every parameter NaN at
    # once: the step is dropped and counted instead, and the data builder names the bad row
    _, data = tiny
    texture = data.texture.clone()
    texture[0, 0, 5, 5] = float("nan")
    bad = dataclasses.replace(data, texture=texture)
    with pytest.raises(ValueError, match="non-finite texture"):
        check_dataset(bad)
    check_dataset(data)
    seed_everything(0)
    model = create_model("arrcoc-texture", weights=None)
    log = train(model, bad, TrainConfig(steps=6, batch=8, seed=1, threads=2), progress=False)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert 0 < log["steps_skipped"] < 6, "the batches without the NaN scene still train"
    empty = data.hit.clone()
    empty[1] = False
    with pytest.raises(ValueError, match="no target cell"):
        check_dataset(dataclasses.replace(data, hit=empty))


def test_evaluate_reports_every_category(tiny) -> None:
    model, data = tiny
    r = evaluate(model, data)
    objects = sum(k in CAPTION_KINDS for k in data.meta["kind"])
    assert 0 < objects < len(data), "the tiny set has object captions and captions for the other ways"
    # "overall" and the per-attribute tables are over the object captions, as in earlier reports
    assert 0 <= r["overall"] <= 1 and r["n"] == objects and r["all_captions"]["n"] == len(data)
    assert set(r["by"]) == {"kind", "colour", "shape", "position", "size"}
    assert sum(d["n"] for d in r["by"]["colour"].values()) == objects
    assert sum(d["n"] for d in r["by"]["kind"].values()) == len(data)
    # the balancer's weights by kind: three distributions that sum to one per caption
    b = r["balance"]
    assert b["all captions"]["n"] == len(data) and b["objects (all kinds)"]["n"] == objects
    for g in b.values():
        assert abs(sum(g[n]["mean"] for n in ("information", "perspectival", "participatory")) - 1) < 1e-3
        assert abs(sum(g["largest"].values()) - 1) < 1e-3
        assert all(
            0 <= g[n]["p10"] <= g[n]["p50"] <= g[n]["p90"] <= 1 for n in ("information", "perspectival")
        )


def test_knowing_captions_leave_scenes_and_object_captions_unchanged() -> None:
    base = make_scenes(8, 5, SceneConfig(extra_phrasings=2))
    more = make_scenes(8, 5, SceneConfig(extra_phrasings=2, knowing=4))
    assert all(
        np.array_equal(a.image, b.image) and b.captions[: len(a.captions)] == a.captions
        for a, b in zip(base, more, strict=True)
    )
    added = [c for a, b in zip(base, more, strict=True) for c in b.captions[len(a.captions) :]]
    assert len(added) == 8 * 4 and {k for _, _, k in added} <= set(KNOWING_KINDS)
    for text, t, kind in added:
        assert (t == KNOWING_OBJECT) == (kind != "edges"), text
    train_words = [w for train, _ in KNOWING_WORDS.values() for w in train]
    held_words = [w for _, held in KNOWING_WORDS.values() for w in held]
    assert not set(train_words) & set(held_words)
    captions = [
        c for s in make_scenes(150, 11, SceneConfig(extra_phrasings=2, knowing=4)) for c, _, _ in s.captions
    ]
    for w in held_words:  # held-out phrasings of the other ways never appear in training
        w = w.split("{d}")[0]
        assert not any(w in c for c in captions), w
    held = [
        c
        for s in make_scenes(60, 12, SceneConfig(heldout_phrasing=True, knowing=4))
        for c, _, _ in s.captions
    ]
    assert any(w.split("{d}")[0] in c for w in held_words for c in held)


def test_knowing_targets() -> None:
    g = torch.Generator().manual_seed(0)
    fixed = torch.rand(3, 2, 32, 32, generator=g)
    t = map_target(fixed, ["detail", "salience", "plain"])
    assert t.shape == (3, 32, 32) and [int(x.sum()) for x in t] == [21, 21, 52]
    assert t[0].flatten()[fixed[0, 0].flatten().argmax()], "detail: the information map's best cell"
    assert t[1].flatten()[fixed[1, 1].flatten().argmax()], "salience: the perspectival map's best cell"
    assert t[2].flatten()[fixed[2].mean(0).flatten().argmin()], "plain: the cell lowest in both"
    masks = np.zeros((1, 512, 512), bool)
    masks[0, 100:300, 104:300] = True  # columns 104..299: cells 6 and 18 are partly covered
    edge, inside = edge_cells(masks)[0], hit_cells(masks)[0]
    assert edge[10, 6] and edge[10, 18] and not edge[10, 12] and inside[10, 12] and not edge[2, 2]


def test_other_ways_train_the_balancer_not_the_participatory_scorer(tiny) -> None:
    # a caption for another way of knowing has no participatory target: its gradient reaches the
    # balancer only; an object caption trains both
    _, data = tiny
    seed_everything(0)
    model = create_model("arrcoc-texture", weights=None).train()
    step = make_step(model, TrainConfig(), torch.device("cpu"))
    kinds = data.meta["kind"]
    for wanted, part_moves in ((("detail", "salience"), False), (CAPTION_KINDS, True)):
        rows = torch.tensor([i for i, k in enumerate(kinds) if k in wanted])
        assert len(rows), wanted
        model.zero_grad()
        scene = data.scene[rows]
        step(
            data.texture[scene], data.fixed[scene], data.query[rows], data.hit[rows], data.part_hit[rows]
        ).backward()
        part_grad = sum(
            float(p.grad.abs().sum()) for p in model.participatory.parameters() if p.grad is not None
        )
        assert (part_grad > 0) == part_moves, wanted
        assert float(model.balancer.mlp[2].weight.grad.abs().sum()) > 0
    # rows without a target add nothing to the loss (and no NaN)
    scores = torch.rand(2, 32, 32)
    hit = torch.zeros(2, 32, 32, dtype=torch.bool)
    hit[0, 3, 3] = True
    assert torch.allclose(pointing_loss(scores, hit, 20.0), pointing_loss(scores[:1], hit[:1], 20.0))
    assert float(pointing_loss(scores, torch.zeros_like(hit), 20.0)) == 0.0


def test_run_training_writes_weights_and_report(tmp_path: Path, query_encoder, monkeypatch) -> None:
    monkeypatch.setattr("arrcoc.train.run.QueryEncoder", lambda *a, **k: query_encoder)
    out = tmp_path / "arrcoc-texture.safetensors"
    cfg = TrainConfig(scenes=4, eval_scenes=3, steps=2, batch=4, threads=2)
    report = run_training(cfg, out, cache_dir=tmp_path / "cache", progress=False)
    js, md = report_paths(out)
    assert out.is_file() and js.is_file() and md.is_file()
    assert json.loads(js.read_text())["weights_version"] == report["weights_version"]
    assert {"trained", "untrained"} == set(report["accuracy"]) and "## By colour" in md.read_text()
    assert (
        "## Balancer weights (held-out captions)" in md.read_text()
        and "balance" in report["accuracy"]["trained"]
    )
    loaded = create_model("arrcoc-texture", weights=out)
    assert loaded.weights_version == report["weights_version"]
    assert (tmp_path / "cache" / "train").is_dir(), "scene tensors are cached"
    again = reevaluate(
        out, cfg, cache_dir=tmp_path / "cache", progress=False
    )  # `arrcoc train --evaluate-only`
    assert again["accuracy"]["trained"] == report["accuracy"]["trained"] and "evaluated" in again


def test_extended_training_phrasings_stay_clear_of_the_heldout_ones() -> None:
    import re

    from arrcoc.train.scenes import RELATIONS, SHAPE_WORDS, SIZE_WORDS

    base = make_scenes(8, 5)
    extended = make_scenes(8, 5, SceneConfig(extra_phrasings=3))
    # the extra captions come from their own generator: same scenes, same first captions
    assert all(
        np.array_equal(a.image, b.image) and b.captions[: len(a.captions)] == a.captions
        for a, b in zip(base, extended, strict=True)
    )
    assert sum(len(s.captions) for s in extended) > 2 * sum(len(s.captions) for s in base)
    # and the held-out set does not depend on it
    held = SceneConfig(heldout_phrasing=True)
    assert [s.captions for s in make_scenes(6, 9, held)] == [
        s.captions for s in make_scenes(6, 9, SceneConfig(heldout_phrasing=True, extra_phrasings=2))
    ]
    words = [
        h
        for table in (SHAPE_WORDS, SIZE_WORDS, RELATIONS)
        for _, held_words in table.values()
        for h in held_words
    ]
    words += ["the biggest one", "the largest thing", "the tiniest shape", "the smallest thing"]
    captions = [c for s in make_scenes(150, 11, SceneConfig(extra_phrasings=3)) for c, _, _ in s.captions]
    for w in words:
        pattern = r"\bplus\b(?! (sign|symbol|mark))" if w == "plus" else rf"\b{re.escape(w)}\b"
        assert not any(re.search(pattern, c) for c in captions), w
    prefixes = tuple(f.split("{d}")[0] for f in HELDOUT_FRAMES if f.split("{d}")[0])
    assert not any(c.startswith(prefixes) or c.endswith(", please") for c in captions)


def test_some_training_scenes_have_a_large_area_of_one_colour_named_by_it() -> None:
    # photos have large coloured areas (a dusk sky); without them in training, "the blue one" on a
    # photo points at small bright things instead
    from arrcoc.train.scenes import COLOURS, REGION

    config = SceneConfig(knowing=2, colour_regions=0.5)
    scenes = make_scenes(24, 21, config)
    named = [s for s in scenes if any(kind == REGION for _, _, kind in s.captions)]
    assert 0.25 <= len(named) / len(scenes) <= 0.75
    for s in named:
        text, t, _ = next(c for c in s.captions if c[2] == REGION)
        o, mask = s.objects[t], s.masks[t]
        assert o.kind == REGION and o.colour in text and mask.mean() > 0.2, (text, mask.mean())
        assert not (s.masks.sum(0) > 1).any() and hit_cells(s.masks[t : t + 1]).sum() > 200
        assert all(x.colour != o.colour for x in s.objects[:t]), "the colour names the region alone"
        # what a person would call it: the named hue (saturated), or bright / dark for white / black
        r, g, b = s.image[mask].mean(0) / 255
        hue, sat, val = colorsys.rgb_to_hsv(r, g, b)
        if o.colour in ("white", "black"):
            assert (min(r, g, b) > 0.7) if o.colour == "white" else (max(r, g, b) < 0.25), (text, r, g, b)
        else:
            named = colorsys.rgb_to_hsv(*(np.array(COLOURS[o.colour]) / 255))[0]
            assert min(abs(hue - named), 1 - abs(hue - named)) < 0.05 and sat > 0.4, (text, r, g, b)
    # drawn from their own generator: the objects, their masks and captions are those without regions
    base = make_scenes(24, 21, SceneConfig(knowing=2))
    for a, b in zip(base, scenes, strict=True):
        assert b.captions[: len(a.captions)] == a.captions
        assert np.array_equal(b.masks[: len(a.objects)], a.masks)
    # the held-out sets have none (SceneConfig's default), and the training data asks for some
    assert SceneConfig().colour_regions == 0 and TrainConfig().colour_regions == 0  # opt-in (docs/model.md)
