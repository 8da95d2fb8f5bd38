"""Colour queries on real photos (scikit-image's): the bundled weights' top cells move toward the
named colour against a contrasting query. The model was trained on synthetic scenes only; this
is the check that its colour words carry over to photos."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from PIL import Image

from arrcoc.registry import create_model

skdata = pytest.importorskip("skimage.data")
torch.set_num_threads(2)
TOP = 20  # cells whose mean colour is compared (of 1024)
MARGIN = 0.03  # the named query's top cells must be this much more of the colour (RGB in [0, 1])

# how much of a colour a mean RGB has: opponent differences, and white as the darkest channel
# (bright and grey), black as the brightest one negated
COLOUR_SCORE = {
    "red": lambda r, g, b: r - (g + b) / 2,
    "orange": lambda r, g, b: r - b,
    "blue": lambda r, g, b: b - (r + g) / 2,
    "white": lambda r, g, b: min(r, g, b),
    "black": lambda r, g, b: -max(r, g, b),
}

CHECKS = [  # (photo, named colour, contrasting colour): colours a person sees in the photo
    ("coffee", "red", "white"),  # the red saucer rim against the white cup
    ("coffee", "white", "red"),
    ("chelsea", "orange", "white"),  # the ginger cat against its white whiskers and chest
    ("astronaut", "red", "white"),  # the flag's and badge's red against the white suit
    ("astronaut", "white", "red"),
    ("astronaut", "black", "white"),  # the black background
    (
        "rocket",
        "blue",
        "white",
    ),  # the dusk sky, a large dark-blue area (training's colour regions), not the launch lights
    ("rocket", "black", "white"),  # the dark towers and sky against the white rocket
]


@pytest.fixture(scope="module")
def model():
    # ARRCOC_COLOUR_WEIGHTS: check candidate weights (a .safetensors path) before they are bundled
    return create_model("arrcoc-texture", weights=os.environ.get("ARRCOC_COLOUR_WEIGHTS", "default")).eval()


def _top_colour(model, photo: str, queries: list[str], encoder) -> list[tuple[float, float, float]]:
    size = model.config.image_size
    rgb = np.asarray(
        Image.fromarray(getattr(skdata, photo)()).convert("RGB").resize((size, size), Image.BILINEAR)
    )
    images = torch.from_numpy(rgb.copy()).permute(2, 0, 1)[None].expand(len(queries), -1, -1, -1).contiguous()
    with torch.no_grad():
        out = model(images, encoder.encode(queries), model.default_controls(len(queries)))
    cells = out.texture[:, :3].flatten(2)  # (Q, 3, N): each cell's mean RGB in [0, 1]
    return [tuple(cells[i][:, out.order[i, :TOP]].mean(1).tolist()) for i in range(len(queries))]


@pytest.mark.parametrize(("photo", "colour", "contrast"), CHECKS)
def test_top_cells_move_toward_the_named_colour(
    model, query_encoder, photo: str, colour: str, contrast: str
) -> None:
    named, other = _top_colour(model, photo, [f"the {colour} one", f"the {contrast} one"], query_encoder)
    score = COLOUR_SCORE[colour]
    assert score(*named) > score(*other) + MARGIN, (
        f"{photo}: 'the {colour} one' top cells {np.round(named, 2).tolist()} are not more {colour} than "
        f"'the {contrast} one' {np.round(other, 2).tolist()}"
    )
