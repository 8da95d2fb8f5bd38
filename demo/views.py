"""Every view of the Inference tab, drawn from one stored run (never by running the model again).

Each function takes a `Run` and returns what its Gradio components show: PIL images, markdown,
HTML legends, pandas frames for tables and plotly figures (demo/charts.py) for charts.
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFont

from arrcoc import metrics
from arrcoc.configs import CHANNEL_NAMES, COMPAT_CHANNEL_NAMES
from arrcoc.render import budget_image, colorize, colormap_hex, heatmap_image, homunculus, overlay, tint_cells
from arrcoc.request import MAX_CELL_TOKENS, MIN_CELL_TOKENS
from arrcoc.result import SCORER_NAMES, TENSION_NAMES, WEAK_MATCH, RelevanceResult

from . import charts

DISPLAY_SIDE = 640  # longest side of the images the views show
CHANNEL_GROUPS = {  # texture channel indices per group (arrcoc/texture.py order)
    "colour": (0, 1, 2, 3, 4, 11),
    "edges": (5, 6, 7, 12),
    "position": (8, 9, 10),
}
SCALES = {  # colour scales for the maps: label -> name used by scaled()
    "square root": "sqrt",  # the default: faint cells stay visible next to a sharp peak
    "linear": "linear",
    "rank": "rank",
}
MAPS = {  # overlay choices: label -> (RelevanceResult attribute, value range)
    "relevance (balanced)": ("relevance", (0.0, 1.0)),
    "information": ("information", (0.0, 1.0)),
    "perspectival": ("perspectival", (0.0, 1.0)),
    "participatory": ("participatory", (0.0, 1.0)),
    "token budget": ("budget_map", (0.0, float(MAX_CELL_TOKENS))),
}
SELECTED_RGB = (64, 224, 208)  # turquoise: stands out on the warm heatmap colours
GAINED_RGB, LOST_RGB, KEPT_RGB = (46, 204, 113), (231, 76, 60), (240, 240, 240)


@dataclass(frozen=True)
class Run:
    """One click of Run: the photo as shown, the result, and the same run without the query."""

    image: Image.Image  # display-sized RGB
    result: RelevanceResult
    without_query: RelevanceResult | None = None  # scale_participatory = 0
    scale: str = "sqrt"  # how map values become colours (SCALES); a display choice, not the model's

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def display_image(img: Image.Image, side: int = DISPLAY_SIDE) -> Image.Image:
    img = img.convert("RGB")
    scale = side / max(img.size)
    if scale < 1:
        img = img.resize(
            (max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.Resampling.LANCZOS
        )
    return img


def colourbar_html(low: str, high: str, title: str) -> str:
    stops = ", ".join(colormap_hex(9))
    return (
        f'<div class="arr-legend"><span class="arr-legend-title">{title}</span>'
        f'<span>{low}</span><span class="arr-legend-bar" style="background: linear-gradient(to right, {stops})">'
        f"</span><span>{high}</span></div>"
    )


def peak(*maps: np.ndarray) -> float:
    """Maps are shown from 0 to their peak (shared by maps compared side by side): where, not how much."""
    return max(max(float(np.max(m)) for m in maps), 1e-6)


def scaled(values: np.ndarray, vmax: float, scale: str) -> np.ndarray:
    """Map values in [0, vmax] -> [0, 1] for colouring: linear, square root, or rank (percentile)."""
    v = np.clip(np.asarray(values, dtype=np.float64) / vmax, 0.0, 1.0)
    if scale == "sqrt":
        return np.sqrt(v)
    if scale == "rank":
        ranks = np.empty(v.size)
        ranks[np.argsort(v, axis=None, kind="stable")] = np.arange(v.size)
        return (ranks / max(v.size - 1, 1)).reshape(v.shape)
    return v


def heat(
    values: np.ndarray, size: tuple[int, int], vmax: float | None = None, scale: str = "linear"
) -> Image.Image:
    return heatmap_image(scaled(values, peak(values) if vmax is None else vmax, scale), size)


def _cell(i: int, grid: int) -> str:
    return f"({i // grid}, {i % grid})"


def cell_size(r: RelevanceResult) -> str:
    """A cell in the photo's own pixels: the grid spans the whole photo, so cells of a non-square
    photo are not square (a 600x400 photo's cell is 18.8 x 12.5 px)."""
    w, h = r.image_size
    return f"{w / r.grid:.3g} × {h / r.grid:.3g} px"


# ---- the match score: shown above every view --------------------------------------------------


# words of place, and the filler around them: a query made only of these names a position, not a thing
POSITION_WORDS = frozenset(
    "top bottom left right middle centre center upper lower corner side edge half "
    "above below near far".split()
)
FILLER_WORDS = frozenset("the a an in at on of to one part area region bit thing".split())


def position_only(query: str) -> bool:
    """Whether the query names only a place ("the top left"), nothing that is there."""
    words = [
        w for w in "".join(c if c.isalnum() else " " for c in query.lower()).split() if w not in FILLER_WORDS
    ]
    return bool(words) and all(w in POSITION_WORDS for w in words)


# what a score at or above WEAK_MATCH can and cannot say: the line was checked on synthetic scenes
# only, and on photos queries for things that are not there score above it too
UNCALIBRATED = (
    "Not calibrated on photos: the {line} line was checked on synthetic scenes, and on a photo a thing "
    "that is not there can score above it (“the text” does on a cat photo with no text)."
)


def _knows(variant: str) -> str:
    """What the served model can match on a photo, in a few words (docs/model.md's model cards)."""
    if variant.startswith("arrcoc-texture"):
        return " This model matches colours, edges, positions and text-like marks, not kinds of objects:"
    return ""


def match_html(r: RelevanceResult | None) -> str:
    """The match score, what it measures, and what it means for this map: a weak one says that no
    cell resembles the query closely (the bright cells are still the photo's best candidates); a
    higher one is a possible match, not a confirmed find, since the score is not calibrated on
    photos (said here, beside the number, not only in the About section)."""
    if r is None:
        return '<div class="arr-match arr-match-none">Match score: run the model to see how well the query matches.</div>'
    if r.match_score is None:
        return '<div class="arr-match arr-match-none">Match score: not reported by this server.</div>'
    q = escape(r.query)
    if not r.weak_match:
        return (
            f'<div class="arr-match arr-match-unsure"><b>Match score: {r.match_score:.2f} — a possible match</b> '
            f"(a match starts at {WEAK_MATCH:.2f}): a cell here resembles “{q}” to this model. "
            f"{UNCALIBRATED.format(line=f'{WEAK_MATCH:.2f}')}{_knows(r.variant)} "
            "check the bright cells against the photo.</div>"
        )
    where = (
        f" “{q}” names a place, not a thing: the score rates what is in a cell, not where it is, so position "
        "queries score low even when the map points the right way."
        if position_only(r.query)
        else ""
    )
    return (
        f'<div class="arr-match arr-match-weak"><b>Weak match: {r.match_score:.2f}</b> (a match starts at '
        f"{WEAK_MATCH:.2f}). The score rates how closely the best-matching cell resembles “{q}”; here no cell "
        "resembles it closely. The maps below still rank the cells against each other (each is scaled to its own "
        f"peak, so it always has a bright spot): their bright cells are this photo's best candidates for “{q}”, "
        f"which may or may not be what you meant. Check them against the photo.{where}</div>"
    )


# ---- overview -------------------------------------------------------------------------------


def overview(run: Run) -> tuple[Image.Image, Image.Image, Image.Image, str]:
    r = run.result
    relevance = heat(r.relevance, run.size, scale=run.scale)
    chosen = tint_cells(
        run.image, r.grid, [(metrics.cell_mask(r.selected, r.grid), SELECTED_RGB)], alpha=0.45, dim=0.55
    )
    return run.image, relevance, chosen, summary_markdown(r)


def summary_markdown(r: RelevanceResult) -> str:
    match = (
        "n/a"
        if r.match_score is None
        else f"**{r.match_score:.2f}**"
        + (" (**weak match**)" if r.weak_match else " (a possible match; not calibrated on photos)")
    )
    weights = " · ".join(f"{n} **{w:.2f}**" for n, w in zip(SCORER_NAMES, r.balance, strict=True))
    top = ", ".join(_cell(int(i), r.grid) for i in r.selected[:3])
    best = int(np.argmax(r.relevance))
    t = r.timings_ms
    timing = (
        f"{t.get('model_ms', 0):.0f} ms model + {t.get('preprocess_ms', 0):.0f} ms preprocessing"
        if t
        else "n/a"
    )
    note = ""
    if r.weights_version == "untrained":
        note = "\n\n> **Note:** these weights are **untrained** (random initialisation): maps show the pipeline, not learned relevance."
    if r.benchmark_only:
        note += "\n\n> **Note: benchmark-only variant**: randomly initialised, not meant for relevance."
    return (
        f"**“{r.query}”** — {r.k} of {r.grid * r.grid} cells selected, "
        f"{int(r.budgets.sum()):,} of {r.token_budget:,} tokens. Peak relevance {r.relevance.flat[best]:.3f}; "
        f"most relevant cells (row, col): {top}. Match score {match}. One cell is {cell_size(r)} of this photo.\n\n"
        f"Balancer weights: {weights}. Time: {timing}. "
        f"Model `{r.variant}` · weights `{r.weights_version}` · backend `{r.backend}`.{note}"
    )


def foveated_view(run: Run, patch: int = 14) -> tuple[Image.Image, str]:
    """What a vision-language model would be given under this result's budgets (arrcoc.foveate):
    selected cells as sharp as their tokens afford, the rest at 4 x 4 pixels a cell; beside the
    "vs uniform" view. Drawn on the displayed photo (torch is imported here, not with the demo)."""
    from arrcoc.foveate import DEFAULT_BASE_SIDE, foveated_image

    r = run.result
    w, h = r.image_size
    side = np.floor(np.sqrt(np.asarray(r.budgets, dtype=np.float64))) * patch
    full = int(np.sum((side >= h / r.grid) & (side >= w / r.grid)))
    md = (
        f"The picture a VLM with {patch}-px patches would get: {r.k} selected cells, {int(r.budgets.sum()):,} tokens "
        f"({MIN_CELL_TOKENS}–{MAX_CELL_TOKENS} a cell, ⌊√tokens⌋² patches); {full} of them afford every pixel of "
        f"their {w / r.grid:.0f}×{h / r.grid:.0f}-px cell in the {w}×{h} photo. The other cells are kept at "
        f"{DEFAULT_BASE_SIDE}×{DEFAULT_BASE_SIDE} pixels. `selected_boxes` in the JSON lists the same cells in the "
        "photo's pixels with their tokens."
    )
    return foveated_image(run.image, r.budget_map, patch), md


# ---- homunculus, three ways, overlays ----------------------------------------------------------


def homunculus_view(run: Run) -> tuple[Image.Image, str]:
    r = run.result
    cells = r.grid * r.grid
    full_tokens = cells * MAX_CELL_TOKENS
    md = (
        f"### {r.k} / {cells} cells kept — {cells / r.k:.1f}× fewer cells\n"
        f"The model looks at the bright cells only; each gets {MIN_CELL_TOKENS}–{MAX_CELL_TOKENS} vision tokens by relevance. "
        f"{int(r.budgets.sum()):,} tokens in all, {full_tokens / max(int(r.budgets.sum()), 1):.1f}× fewer than "
        f"giving every cell the maximum ({full_tokens:,})."
    )
    return homunculus(run.image, r.selected, r.grid, dim=0.18), md


def three_ways(run: Run) -> tuple[Image.Image, Image.Image, Image.Image, Image.Image, str]:
    r = run.result
    maps = [
        heat(getattr(r, n), run.size, scale=run.scale)
        for n in ("information", "perspectival", "participatory", "relevance")
    ]
    rows = "\n".join(f"| {n} | {w:.3f} |" for n, w in zip(SCORER_NAMES, r.balance, strict=True))
    tens = "\n".join(
        f"| {n.replace('_', ' ↔ ')} | {v:.3f} |" for n, v in zip(TENSION_NAMES, r.tensions, strict=True)
    )
    md = (
        "The balancer mixes the three scorers with query-dependent weights (they sum to 1):\n\n"
        f"| scorer | weight |\n|---|---|\n{rows}\n\n"
        "Learned tensions (0 → first pole, 1 → second pole):\n\n"
        f"| tension | value |\n|---|---|\n{tens}"
    )
    return (*maps, md)


def overlay_view(run: Run | None, map_label: str, opacity: float) -> Image.Image | None:
    if run is None:
        return None
    attr, (_, hi) = MAPS.get(map_label, MAPS["relevance (balanced)"])
    values = np.asarray(getattr(run.result, attr), dtype=np.float64)
    vmax = hi if attr == "budget_map" else peak(values)
    return overlay(run.image, scaled(values, vmax, "linear" if attr == "budget_map" else run.scale), opacity)


# ---- texture, budgets ----------------------------------------------------------------------------


def label_font(size: int) -> ImageFont.ImageFont:
    for name in ("DejaVuSans.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"):
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size)


def labelled(tile: Image.Image, *lines: str) -> Image.Image:
    """The tile with its label drawn under it, so no gallery can truncate or cover it."""
    font, pad, line_h = label_font(15), 6, 19
    out = Image.new("RGB", (tile.width, tile.height + pad * 2 + line_h * len(lines)), (255, 255, 255))
    out.paste(tile, (0, 0))
    draw = ImageDraw.Draw(out)
    for i, text in enumerate(lines):
        draw.text(
            (tile.width // 2, tile.height + pad + i * line_h), text, fill=(30, 30, 30), font=font, anchor="mt"
        )
    return out


def texture_view(run: Run) -> tuple[list, list, list]:
    r = run.result
    names = COMPAT_CHANNEL_NAMES if "compat" in r.variant else CHANNEL_NAMES
    galleries = []
    for idx in CHANNEL_GROUPS.values():
        items = []
        for c in idx:
            ch = np.asarray(r.texture[c], dtype=np.float64)
            lo, hi = float(ch.min()), float(ch.max())
            tile = Image.fromarray(colorize(ch, lo, hi if hi > lo else lo + 1)).resize(
                (224, 224), Image.Resampling.NEAREST
            )
            name, span = names[c].replace("_", " "), f"[{lo:.2f}, {hi:.2f}]"
            items.append(labelled(tile, name, span))  # the label in the image: a gallery caption gets cut
        galleries.append(items)
    return tuple(galleries)  # type: ignore[return-value]


def budget_view(run: Run) -> tuple[Image.Image, str, object]:
    r = run.result
    b = r.budgets
    md = (
        f"**{int(b.sum()):,}** of {r.token_budget:,} tokens over {r.k} cells: "
        f"min {int(b.min())}, median {int(np.median(b))}, max {int(b.max())} tokens per cell. "
        "Dark cells were not selected (0 tokens)."
    )
    return budget_image(r.budget_map, run.size), md, charts.budget_curve(b.astype(int))


# ---- baseline, metrics -------------------------------------------------------------------------------

METRIC_ROWS = (  # field, label, what it means
    ("relevance_captured", "relevance captured", "share of the map's total relevance on kept cells"),
    ("coverage", "coverage", f"share of the {metrics.REGIONS}×{metrics.REGIONS} regions with a kept cell"),
    ("spatial_entropy", "spatial entropy", "0 = all in one region, 1 = spread evenly"),
    ("mean_nn_distance", "mean NN distance", "cells from a kept cell to its nearest kept neighbour"),
    ("clusters", "clusters", "8-connected groups of kept cells"),
)


def _metric_table(named: dict[str, metrics.SelectionMetrics], which: tuple = METRIC_ROWS) -> pd.DataFrame:
    rows = []
    for field, label, meaning in which:
        row = {"metric": label}
        for name, m in named.items():
            v = getattr(m, field)
            row[name] = int(v) if isinstance(v, int) else round(float(v), 3)
        row["meaning"] = meaning
        rows.append(row)
    return pd.DataFrame(rows)


SPREAD_ROWS = tuple(row for row in METRIC_ROWS if row[0] != "relevance_captured")


def comparison_view(run: Run) -> tuple[Image.Image, Image.Image, pd.DataFrame, str]:
    """Where the same K cells go: by this query's relevance, or on a query-blind lattice. Only how
    the cells spread is compared: the share of *this* map each keeps would be circular (the top
    cells of a map always hold more of it than a lattice does) and says nothing about whether the
    map is right."""
    r = run.result
    base = metrics.uniform_selection(r.grid, r.k)
    ours_m = metrics.selection_metrics(r.relevance, r.selected)
    base_m = metrics.selection_metrics(r.relevance, base)
    both = len(set(map(int, base)) & set(map(int, r.selected)))
    md = (
        f"Same K = {r.k} cells, {r.k / (r.grid * r.grid):.0%} of the image; they share {both} cells. ARR-COC puts them "
        f"in **{ours_m.clusters}** group(s) covering {ours_m.coverage:.0%} of the {metrics.REGIONS}×{metrics.REGIONS} "
        f"regions; the lattice covers {base_m.coverage:.0%}. Which is better depends on whether the map is right "
        "(see the match score above): the table compares where the cells go, not how good they are."
    )
    images = [homunculus(run.image, sel, r.grid, dim=0.18) for sel in (r.selected, base)]
    return (
        images[0],
        images[1],
        _metric_table({"ARR-COC": ours_m, "uniform lattice": base_m}, SPREAD_ROWS),
        md,
    )


def metrics_view(run: Run) -> tuple[pd.DataFrame, Image.Image]:
    """The metrics table, and the kept cells counted per region (the basis of coverage and entropy)."""
    r = run.result
    counts = metrics.region_counts(r.selected, r.grid).astype(np.float64)
    regions = overlay(run.image, counts / max(counts.max(), 1.0), alpha=0.6)
    return _metric_table({"ARR-COC": metrics.selection_metrics(r.relevance, r.selected)}), regions


# ---- query impact, attribution ----------------------------------------------------------------


def impact_view(run: Run) -> tuple[Image.Image | None, Image.Image | None, Image.Image | None, str]:
    r, w = run.result, run.without_query
    if w is None:
        return None, None, None, "Run the model to see what the query changes."
    imp = metrics.query_impact(r.relevance, r.selected, w.relevance, w.selected)
    g = r.grid
    kept = metrics.cell_mask(
        np.array(sorted(set(map(int, r.selected)) & set(map(int, w.selected))), dtype=np.int64), g
    )
    change = tint_cells(
        run.image,
        g,
        [
            (kept, KEPT_RGB),
            (metrics.cell_mask(imp.gained, g), GAINED_RGB),
            (metrics.cell_mask(imp.lost, g), LOST_RGB),
        ],
        alpha=0.6,
        dim=0.3,
    )
    md = (
        f"“{r.query}”: **overlap {imp.overlap}/{r.k} cells ({imp.overlap_share:.1%}, Jaccard {imp.jaccard:.2f})** between the "
        f"selection with the query and without the participatory scorer (its scale set to 0). "
        f"The relevance centroid moves **{imp.centroid_shift:.1f} cells**; mean |Δ relevance| per cell "
        f"{imp.mean_abs_change:.3f}. <span style='color:#2ecc71'>■</span> gained by the query "
        f"({len(imp.gained)}), <span style='color:#e74c3c'>■</span> lost ({len(imp.lost)}), <span style='color:#c8c8c8'>■</span> kept by both."
    )
    top = peak(r.relevance, w.relevance)  # one scale for both, so they compare
    return (
        heat(r.relevance, run.size, top, run.scale),
        heat(w.relevance, run.size, top, run.scale),
        change,
        md,
    )


def attribution_view(run: Run) -> tuple[object, str]:
    r = run.result
    names = COMPAT_CHANNEL_NAMES if "compat" in r.variant else CHANNEL_NAMES
    corr = metrics.channel_attribution(r.texture, r.relevance)
    group_of = {c: g for g, idx in CHANNEL_GROUPS.items() for c in idx}
    df = pd.DataFrame(
        {
            "channel": [f"{i:02d} {n}" for i, n in enumerate(names)],
            "correlation": np.round(corr, 4),
            "group": [group_of[i] for i in range(len(names))],
        }
    )
    order = np.argsort(-np.abs(corr))[:3]
    top = ", ".join(f"{names[i]} ({corr[i]:+.2f})" for i in order)
    md = (
        "Pearson correlation, over the cells of this image, between each texture channel and the "
        f"relevance map. Strongest: {top}. Correlation is a description, not a causal attribution."
    )
    return charts.attribution(df), md
