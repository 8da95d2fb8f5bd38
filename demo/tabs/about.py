"""The page's header and its "About the model" note: what the serving variant is and what it can
and cannot find, with every number read from its config and its training report."""

from __future__ import annotations

import json

from arrcoc.registry import default_weights_path, get_variant
from arrcoc.request import MAX_CELL_TOKENS, MIN_CELL_TOKENS
from arrcoc.result import WEAK_MATCH
from arrcoc.settings import Settings, get_settings
from arrcoc.variant import Variant

# What each variant can and cannot ground, in a user's words (docs/model.md is the full card).
MODEL_NOTES = {
    "arrcoc-texture": (
        "It reads 13 colour, edge and position features per cell and was trained on **synthetic scenes** "
        "(coloured shapes and blocks of text on plain backgrounds). It grounds **colours** (“the red one”), "
        "**positions** (“the top left”), **text** (“the text”) and the synthetic **shapes** it was trained on. "
        "It has **no notion of object categories**: “the cup”, “a cat”, “the astronaut's face” land on whatever "
        "matches their colour or edges — or on noise.{pointing}"
    ),
    "arrcoc-clip-b16": (
        "CLIP ViT-B/16's image and text towers (OpenAI CLIP, trained on 400M web image–text pairs) with NACLIP's "
        "training-free dense patch features (neighbourhood attention in the last block) on a 14×14 grid, coarser than "
        "the texture model's. CLIP names **object categories** (“the cat”, “the coffee cup”), so such maps are expected "
        "to find them (the literature's finding; this project has not measured it with the real weights). Its weights come from the Hugging Face hub or a local copy."
    ),
}
MODEL_NOTES["arrcoc-clip-b16-448"] = MODEL_NOTES["arrcoc-clip-b16"].replace("14×14", "28×28")
MODEL_NOTES["arrcoc-clip-b16-maskclip"] = MODEL_NOTES["arrcoc-clip-b16"].replace(
    "NACLIP's training-free dense patch features (neighbourhood attention in the last block)",
    "MaskCLIP's dense patch features (the last block's value path)",
)


def serving_variant(settings: Settings | None = None) -> Variant:
    return get_variant((settings or get_settings()).engine.variant)


def intro_markdown(settings: Settings, variant: Variant) -> str:
    c = variant.config
    return (
        f"# ARR-COC Serve\nGive a photo and a query: the model splits the image into a {c.grid}×{c.grid} grid of cells and "
        "scores every cell three ways — **information** (how much is there), **perspectival** salience (what stands "
        "out) and **participatory** coupling with your query — balances them into one relevance map, keeps the K most "
        f"relevant cells and gives each {MIN_CELL_TOKENS}–{MAX_CELL_TOKENS} vision tokens. Serving model: "
        f"**`{variant.name}`** — what it can and cannot find is under *About the model* below."
    )


def pointing_game(variant: Variant) -> float | None:
    """The bundled weights' held-out pointing game, read from their training report beside them."""
    path = default_weights_path(variant.name)
    try:
        report = json.loads(
            path.with_name(path.name.removesuffix(".safetensors") + ".report.json").read_text()
        )
        return float(report["accuracy"]["trained"]["overall"])
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return None


def model_note(variant: Variant) -> str:
    score = pointing_game(variant)
    pointing = (
        f" Its pointing game, **{score:.3f}**, is measured on held-out **synthetic** scenes, not on photos "
        "(the training report is beside its weights)."
        if score is not None
        else ""
    )
    what = MODEL_NOTES.get(variant.name, f"{variant.description}.").replace("{pointing}", pointing)
    c = variant.config
    return (
        f"**`{variant.name}`**: {variant.description}. Images are resized to {c.image_size}×{c.image_size} "
        f"({c.grid}×{c.grid} cells; a cell is 1/{c.grid} of the photo's width and height, so a 600×400 photo's "
        f"cell is {600 / c.grid:.3g}×{400 / c.grid:.3g} px).\n\n{what}\n\n"
        "The **match score** (0–1) says how closely the best cell resembles the query, on one scale for every photo; "
        f"below {WEAK_MATCH:.2f} is a weak match: no cell resembles the query closely. The map still ranks the cells "
        "against each other (every map is scaled to its own peak), so its bright cells are the photo's best "
        f"candidates, not a confirmed find. The {WEAK_MATCH:.2f} line was checked on synthetic scenes, not on photos: "
        "on a photo a score above it is a possible match (the page says so beside the score), and read it as "
        "higher = closer. The full model card — training data, what each variant grounds, evaluation — is "
        "`docs/model.md` in the repository."
    )
