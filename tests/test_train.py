"""Training: scenes are seeded and well-formed; a tiny run is reproducible and writes its report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from arrcoc.registry import create_model
from arrcoc.train.data import _chunk, build_dataset, hit_cells
from arrcoc.train.evaluate import evaluate, relevance_from_fixed
from arrcoc.train.run import reevaluate, report_paths, run_training
from arrcoc.train.scenes import HELDOUT_FRAMES, TRAIN_FRAMES, SceneConfig, make_scenes
from arrcoc.train.trainer import TrainConfig, seed_everything, train

torch.set_num_threads(2)


def test_scenes_are_seeded_and_well_formed() -> None:
    a, b = make_scenes(6, 7), make_scenes(6, 7)
    assert all(np.array_equal(x.image, y.image) and x.captions == y.captions for x, y in zip(a, b, strict=True))
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
    assert all(c.startswith(prefixes) or c.endswith((", please", "?")) or c.startswith("I want") for c in held)


@pytest.fixture(scope="module")
def tiny(query_encoder):
    seed_everything(0)
    model = create_model("arrcoc-texture", weights=None)
    return model, build_dataset(model, query_encoder, 6, 0, SceneConfig(), progress=False)


def test_cached_path_equals_the_model_forward(tiny) -> None:
    # training and the pointing game run on cached tensors: they must equal the real forward
    model, data = tiny
    seed = int(np.random.SeedSequence(0).spawn(1)[0].generate_state(1)[0])  # build_dataset's first chunk
    images, _ = _chunk((6, seed, SceneConfig()))
    rows = torch.arange(min(4, len(data)))
    scene = data.scene[rows]
    with torch.no_grad():
        rel, _ = relevance_from_fixed(model, data.texture[scene], data.fixed[scene], data.query[rows])
        out = model(torch.from_numpy(images)[scene].contiguous(), data.query[rows], model.default_controls(len(rows)))
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
    assert any(not torch.equal(states[0][k], states[2][k]) for k in states[0]), "another seed -> other weights"
    init = create_model("arrcoc-texture", weights=None).state_dict()
    assert not torch.equal(states[0]["participatory.stem.weight"], init["participatory.stem.weight"])


def test_evaluate_reports_every_category(tiny) -> None:
    model, data = tiny
    r = evaluate(model, data)
    assert 0 <= r["overall"] <= 1 and r["n"] == len(data)
    assert set(r["by"]) == {"kind", "colour", "shape", "position", "size"}
    assert sum(d["n"] for d in r["by"]["colour"].values()) == len(data)


def test_run_training_writes_weights_and_report(tmp_path: Path, query_encoder, monkeypatch) -> None:
    monkeypatch.setattr("arrcoc.train.run.QueryEncoder", lambda *a, **k: query_encoder)
    out = tmp_path / "arrcoc-texture.safetensors"
    cfg = TrainConfig(scenes=4, eval_scenes=3, steps=2, batch=4, threads=2)
    report = run_training(cfg, out, cache_dir=tmp_path / "cache", progress=False)
    js, md = report_paths(out)
    assert out.is_file() and js.is_file() and md.is_file()
    assert json.loads(js.read_text())["weights_version"] == report["weights_version"]
    assert {"trained", "untrained"} == set(report["accuracy"]) and "## By colour" in md.read_text()
    loaded = create_model("arrcoc-texture", weights=out)
    assert loaded.weights_version == report["weights_version"]
    assert (tmp_path / "cache" / "train").is_dir(), "scene tensors are cached"
    again = reevaluate(out, cfg, cache_dir=tmp_path / "cache", progress=False)  # `arrcoc train --evaluate-only`
    assert again["accuracy"]["trained"] == report["accuracy"]["trained"] and "evaluated" in again


def test_extended_training_phrasings_stay_clear_of_the_heldout_ones() -> None:
    import re

    from arrcoc.train.scenes import RELATIONS, SHAPE_WORDS, SIZE_WORDS

    base = make_scenes(8, 5)
    extended = make_scenes(8, 5, SceneConfig(extra_phrasings=3))
    # the extra captions come from their own generator: same scenes, same first captions
    assert all(np.array_equal(a.image, b.image) and b.captions[: len(a.captions)] == a.captions
               for a, b in zip(base, extended, strict=True))  # fmt: skip
    assert sum(len(s.captions) for s in extended) > 2 * sum(len(s.captions) for s in base)
    # and the held-out set does not depend on it
    held = SceneConfig(heldout_phrasing=True)
    assert [s.captions for s in make_scenes(6, 9, held)] == [
        s.captions for s in make_scenes(6, 9, SceneConfig(heldout_phrasing=True, extra_phrasings=2))
    ]
    words = [h for table in (SHAPE_WORDS, SIZE_WORDS, RELATIONS) for _, held_words in table.values() for h in held_words]
    words += ["the biggest one", "the largest thing", "the tiniest shape", "the smallest thing"]
    captions = [c for s in make_scenes(150, 11, SceneConfig(extra_phrasings=3)) for c, _, _ in s.captions]
    for w in words:
        pattern = r"\bplus\b(?! (sign|symbol|mark))" if w == "plus" else rf"\b{re.escape(w)}\b"
        assert not any(re.search(pattern, c) for c in captions), w
    prefixes = tuple(f.split("{d}")[0] for f in HELDOUT_FRAMES if f.split("{d}")[0])
    assert not any(c.startswith(prefixes) or c.endswith(", please") for c in captions)
