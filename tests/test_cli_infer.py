"""`arrcoc infer` end to end on a real photo, in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from arrcoc.result import JSON_KEYS

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = (
    "variant",
    "weights_version",
    "backend",
    "grid",
    "relevance",
    "information",
    "perspectival",
    "participatory",
    "balance",
    "tensions",
    "selected",
    "budgets",
)  # fmt: skip -- the issue's list


def arrcoc(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2"}
    return subprocess.run(
        [sys.executable, "-m", "arrcoc", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def infer_run(tmp_path_factory) -> tuple[dict, Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("infer")
    proc = arrcoc(
        "infer",
        "arrcoc/examples/coffee.jpg",
        "--query",
        "the cup",
        "--json",
        str(out / "r.json"),
        "--png",
        str(out / "r.png"),
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "r.json").read_text()), out / "r.png", proc


def test_json_has_the_contract_keys(infer_run) -> None:
    doc, _, proc = infer_run
    assert set(REQUIRED) <= set(doc) and tuple(JSON_KEYS) == REQUIRED
    assert doc["variant"] == "arrcoc-texture" and doc["backend"] == "eager"
    assert doc["weights_version"].startswith("20"), "the bundled trained weights are used by default"
    assert "coffee.jpg" in proc.stdout and "top cells" in proc.stdout


def test_json_values_are_in_range(infer_run) -> None:
    doc, _, _ = infer_run
    g = doc["grid"]
    assert g == 32
    for key in ("relevance", "information", "perspectival", "participatory"):
        m = np.asarray(doc[key], dtype=np.float64)
        assert m.shape == (g, g) and m.min() >= 0 and m.max() <= 1, key
    assert len(doc["balance"]) == 3 and abs(sum(doc["balance"]) - 1) < 1e-4 and min(doc["balance"]) >= 0
    assert set(doc["tensions"]) == {"compress_particularize", "exploit_explore", "focus_diversify"}
    assert all(0 < v < 1 for v in doc["tensions"].values())
    selected, budgets = doc["selected"], doc["budgets"]
    assert len(selected) == len(budgets) == 200 and len(set(selected)) == 200
    assert all(isinstance(i, int) and 0 <= i < g * g for i in selected)
    rel = np.asarray(doc["relevance"]).reshape(-1)[selected]
    assert np.all(np.diff(rel) <= 1e-6), "selected cells are sorted by relevance, highest first"
    assert all(isinstance(b, int) and 64 <= b <= 400 for b in budgets) and sum(budgets) <= doc["token_budget"]


def test_summary_shows_the_match_score_and_says_what_it_means(infer_run) -> None:
    doc, _, proc = infer_run
    assert f"match {doc['match_score']:.2f}" in proc.stdout
    # "the cup" is an object category, which the texture model does not ground on photos
    assert doc["weak_match"] and "WEAK MATCH (below 0.50)" in proc.stdout


def test_png_is_the_heatmap_at_the_original_size_above_a_caption(infer_run) -> None:
    _, png, _ = infer_run
    with Image.open(png) as im:
        assert im.format == "PNG" and im.mode == "RGB"
        assert im.width == 600 and im.height > 400, "the photo at its own size, a caption strip below"
        pixels = np.asarray(im, dtype=np.int16)
    photo, strip = pixels[:400], pixels[400:]
    assert photo.std() > 20, "the overlay is there"
    assert strip.std() > 20, "the caption strip is not blank"
    assert _has_colour_scale(strip)


def _has_colour_scale(strip: np.ndarray) -> bool:
    """A row of the strip runs from the colour map's low end (near black purple) to its high end
    (pale yellow) left to right: the legend."""
    from arrcoc.render import colorize

    lo, hi = colorize(np.array([0.02])).astype(np.int16)[0], colorize(np.array([0.98])).astype(np.int16)[0]
    for row in strip:
        near_lo = np.flatnonzero(np.abs(row - lo).max(axis=1) < 12)
        near_hi = np.flatnonzero(np.abs(row - hi).max(axis=1) < 12)
        if near_lo.size and near_hi.size and near_lo.min() < near_hi.max():
            return True
    return False


@pytest.mark.parametrize(("score", "weak"), [(0.67, False), (0.07, True), (None, False)])
def test_caption_names_the_query_and_score_for_any_width(score, weak) -> None:
    from arrcoc.render import captioned

    for size in ((600, 400), (64, 48), (1024, 200)):
        photo = Image.new("RGB", size, (90, 140, 60))
        out = captioned(
            photo, "the red one " * 8, score, weak
        )  # a long query is shortened, not cut off wildly
        assert out.width >= size[0] and out.height > size[1]
        strip = np.asarray(out, dtype=np.int16)[size[1] :]
        assert strip.std() > 20 and _has_colour_scale(strip), size
    weak_px = np.asarray(captioned(photo, "q", 0.07, True), dtype=np.int16)[200:]
    ok_px = np.asarray(captioned(photo, "q", 0.07, False), dtype=np.int16)[200:]
    assert (weak_px != ok_px).any(), "a weak match is written differently"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("infer", "EMPTY", "--query", "the cup"), "empty"),
        (("infer", "arrcoc/examples/coffee.jpg", "--query", "   "), "query is empty"),
        (
            ("infer", "arrcoc/examples/coffee.jpg", "--query", "cup", "--variant", "arrcoc-nope"),
            "Unknown model variant",
        ),
    ],
)
def test_cli_errors_are_clear(args, message: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    proc = arrcoc(*(str(empty) if a == "EMPTY" else a for a in args))
    assert proc.returncode == 2, proc.stderr
    assert "arrcoc: error: " in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stderr
