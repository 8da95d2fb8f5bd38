"""The Inference tab's outputs: the overview beside the inputs, and one tab per view under them.
Layout only: what each shows is drawn by demo/views.py from one stored run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from arrcoc.request import MAX_CELL_TOKENS, MIN_CELL_TOKENS

from .. import views
from ..page import caption as _caption
from ..page import md as _md

CHANNEL_GROUP_LABELS = (
    "colour: R, G, B, L*, a*, b*",
    "edges: Sobel x, y, magnitude, contrast",
    "position: y, x, eccentricity",
)


@dataclass
class Views:
    """The view tabs' output components, in render_views' order, plus the overview's own."""

    overview: list[Any]
    status: gr.Markdown
    scale: gr.Radio
    match: list[gr.HTML]  # the match score above the overview and above the other views
    rest: list[Any]
    map: gr.Radio
    opacity: gr.Slider
    overlay: gr.Image
    impact: list[Any]


def overview_block() -> tuple[list[Any], gr.Radio, gr.Markdown]:
    """Photo, relevance and selected cells, beside the inputs: in view as soon as Run returns."""
    with gr.Column(elem_id="overview"):
        with gr.Row():
            photo = gr.Image(label="photo", interactive=False, buttons=["fullscreen"])
            heat = gr.Image(
                label="relevance",
                interactive=False,
                format="png",
                elem_id="relevance-map",
                buttons=["download", "fullscreen"],
            )
            sel = gr.Image(label="selected cells", interactive=False, buttons=["fullscreen"])
        with gr.Row(equal_height=True):
            gr.HTML(views.colourbar_html("low", "high (the map's peak)", "relevance"))
            scale = gr.Radio(
                [(k, v) for k, v in views.SCALES.items()],
                value="sqrt",
                label="colour scale (every map)",
                elem_id="scale",
            )
        md = gr.Markdown(
            "Upload a photo, type a query and press **Run** — or click an example.", elem_id="summary"
        )
        status = gr.Markdown(elem_id="views-status", elem_classes="arr-caption")
    return [photo, heat, sel, md], scale, status


def _homunculus_tab() -> list[Any]:
    with gr.Tab("Homunculus", id="homunculus"):
        _caption("What the model keeps: rejected cells are dimmed.")
        return [gr.Image(label="homunculus", interactive=False, height=420), gr.Markdown()]


def _three_ways_tab() -> list[Any]:
    with gr.Tab("Three ways", id="three"):
        _caption("The three scorers (ways of knowing) and their balanced mix.")
        with gr.Row():
            maps = [
                gr.Image(label=n, interactive=False, format="png")
                for n in ("information", "perspectival", "participatory (query)", "balanced relevance")
            ]
        gr.HTML(views.colourbar_html("low", "high (each map's peak)", "score"))
        return [*maps, gr.Markdown()]


def _overlays_tab() -> tuple[gr.Radio, gr.Slider, gr.Image]:
    with gr.Tab("Overlays", id="overlays"):
        with gr.Row():
            map_in = gr.Radio(list(views.MAPS), value="relevance (balanced)", label="map")
            opacity = gr.Slider(0, 1, value=0.55, step=0.05, label="opacity")
        image = gr.Image(label="overlay", interactive=False, height=420, elem_id="overlay")
        gr.HTML(
            views.colourbar_html(
                "low", f"high (the map's peak; token budget: {MAX_CELL_TOKENS})", "map value"
            )
        )
    return map_in, opacity, image


def _texture_tab() -> list[Any]:
    with gr.Tab("Texture", id="texture"):
        _caption(
            "The 13 per-cell features the scorers read. Each tile is coloured from its own minimum to its own "
            "maximum, given in brackets under its name."
        )
        style = dict(
            height="auto",
            object_fit="contain",
            allow_preview=True,
            elem_classes="arr-texture",
            show_label=False,
        )
        gr.Markdown(f"**{_md(CHANNEL_GROUP_LABELS[0])}**")
        out = [gr.Gallery(columns=6, elem_id="texture-colour", **style)]
        with gr.Row():
            with gr.Column(scale=4):
                gr.Markdown(f"**{_md(CHANNEL_GROUP_LABELS[1])}**")
                out.append(gr.Gallery(columns=4, **style))
            with gr.Column(scale=3):
                gr.Markdown(f"**{_md(CHANNEL_GROUP_LABELS[2])}**")
                out.append(gr.Gallery(columns=3, **style))
    return out


def _budget_tab() -> list[Any]:
    with gr.Tab("LOD budget", id="budget"):
        _caption(
            f"Level of detail: vision tokens per cell ({MIN_CELL_TOKENS}–{MAX_CELL_TOKENS} for kept cells, 0 for the rest)."
        )
        with gr.Row():
            with gr.Column():
                image = gr.Image(label="tokens per cell", interactive=False, format="png")
                gr.HTML(views.colourbar_html("0", f"{MAX_CELL_TOKENS} tokens", "budget"))
            plot = gr.Plot(show_label=False, label="tokens by relevance rank", elem_id="budget-chart")
        return [image, gr.Markdown(), plot]


def _compare_tab() -> list[Any]:
    with gr.Tab("vs uniform", id="compare"):
        _caption(
            "Where the same K cells go: chosen by this query's relevance, or on a query-blind uniform lattice."
        )
        with gr.Row():
            ours = gr.Image(label="ARR-COC", interactive=False)
            base = gr.Image(label="uniform lattice", interactive=False)
        md = gr.Markdown()
        table = gr.DataFrame(label="how the kept cells spread", interactive=False)
        return [ours, base, table, md]


def _foveated_tab() -> list[Any]:
    with gr.Tab("foveated", id="foveated"):
        _caption(
            "What a vision-language model would be given under these budgets: each selected cell as sharp as its "
            "tokens afford, the rest at a low base resolution."
        )
        return [
            gr.Image(label="foveated view", interactive=False, height=420, elem_id="foveated"),
            gr.Markdown(),
        ]


def _metrics_tab() -> list[Any]:
    with gr.Tab("Metrics", id="metrics"):
        _caption("How the kept cells spread over the image (regions: a 4×4 split of the grid).")
        with gr.Row():
            table = gr.DataFrame(label="metrics", interactive=False, elem_id="metrics-table", scale=3)
            image = gr.Image(label="kept cells per region (brighter: more)", interactive=False, scale=2)
        return [table, image]


def _impact_tab() -> list[Any]:
    with gr.Tab("Query impact", id="impact"):
        _caption(
            "With the query vs without the participatory scorer (its scale set to 0): one extra model call."
        )
        with gr.Row():
            with_q = gr.Image(label="relevance with the query", interactive=False)
            without = gr.Image(label="without the participatory scorer", interactive=False)
            change = gr.Image(label="selection change", interactive=False)
        return [with_q, without, change, gr.Markdown(elem_id="impact-summary")]


def _attribution_tab() -> list[Any]:
    with gr.Tab("Attribution", id="attribution"):
        return [
            gr.Plot(show_label=False, label="channel attribution", elem_id="attribution-chart"),
            gr.Markdown(),
        ]


def view_tabs() -> tuple[list[Any], gr.Radio, gr.Slider, gr.Image, list[Any]]:
    """One tab per view, full width under the inputs and the overview."""
    with gr.Tabs(elem_id="views"):
        hom, three = _homunculus_tab(), _three_ways_tab()
        map_in, opacity, ovl = _overlays_tab()
        rest = [
            *hom,
            *three,
            ovl,
            *_texture_tab(),
            *_budget_tab(),
            *_compare_tab(),
            *_foveated_tab(),
            *_metrics_tab(),
        ]
        impact = _impact_tab()
        rest += _attribution_tab()
    return rest, map_in, opacity, ovl, impact
