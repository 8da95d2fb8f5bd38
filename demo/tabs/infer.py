"""The Inference tab: a photo and a query in, the match score, the overview and every view out.

Its handlers run the model once per click (plus once without the query for the impact view) and
store the run; every view is drawn from that stored run. Rate limits are applied at the HTTP door
(demo/guard.py), before any of this runs."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gradio as gr

from arrcoc.images import load_image
from arrcoc.request import MAX_CELL_TOKENS, MIN_CELL_TOKENS, Controls
from arrcoc.settings import BACKENDS, Settings
from arrcoc.variant import Variant

from .. import service, views
from ..errors import user_error
from ..inputs import controls_from, photo_input, query_text, read_image
from ..page import PRIVATE
from ..page import caption as _caption
from ..page import mb as _mb
from ..views import Run
from .infer_views import Views, overview_block, view_tabs

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES_DIR = ROOT / "arrcoc" / "examples"
# (photo, query, label): each checked on the default model (arrcoc-texture, eager, CPU) by looking
# at where its top cells fall; the last shows what the model cannot do.
EXAMPLES = [  # tests/test_demo_views.py checks that each still lands where its label says
    ("chelsea.jpg", "the black one", "colour · the black one (pupils)"),
    ("coffee.jpg", "the red one", "colour · the red one (the cup)"),
    ("astronaut.jpg", "the orange", "colour · the orange (suit)"),
    ("astronaut.jpg", "the text", "text · the text (the patch)"),
    ("coffee.jpg", "the top left", "position · the top left"),
    ("shapes.jpg", "the green circle in the top right", "shapes · green circle in the top right"),
    ("shapes.jpg", "the largest shape", "shapes · the largest shape"),
    ("coffee.jpg", "a giraffe", "LIMIT · a giraffe (not there)"),
]
EXAMPLES_NOTE = (
    "Each checked on this model. The position query points the right way but scores low (the match score rates "
    "what is there, not where). **LIMIT**: a giraffe is not in the photo, yet the map still has a bright peak — only "
    "the weak match score tells you. Photos: scikit-image (public domain); shapes: a synthetic scene like the training data."
)
API_OVERLAY_SIDE = (
    2048  # /infer's overlay: the photo's own size, unless a big JPEG reduces to about this while decoding
)
# closes the error toasts a new photo makes stale ("Upload a photo first"); returns no inputs
CLOSE_ERRORS_JS = (
    "() => { document.querySelectorAll('.toast-body.error .toast-close, "
    "[data-testid=toast-body].error [data-testid=toast-close]').forEach(b => b.click()); return []; }"
)
SERVER_DEFAULT = "server default"  # the backend dropdown's first choice: sends None (ARRCOC_ENGINE__BACKEND)
BACKEND_LABELS = {
    "eager": "eager (PyTorch)",
    "compiled": "compiled (torch.compile + CUDA graphs)",
    "onnx": "onnx (ONNX Runtime)",
    "aot": "aot (AOTInductor packages)",
}


def _backend(choice: str | None) -> str | None:
    """The dropdown's choice as a request's backend: None (the server's own) for "server default"."""
    return None if not choice or choice == SERVER_DEFAULT else choice


def progress_note(backend: str | None) -> str:
    """What the next model call will spend its time on, in words."""
    name = backend or service.served_backend()
    if service.is_ready(name):
        return f"Running the model ({name})"
    if name in ("compiled", "aot"):
        return (
            f"First use of `{name}` on this server: compiling the model (one program for single images, one for batches) "
            "(about a minute on a CPU; later runs take milliseconds)"
        )
    return "Loading the model and the query encoder (first run on this server only)"


def run_model(
    image_path: str | None,
    query: str,
    s_info: float,
    s_persp: float,
    s_part: float,
    k: float,
    budget: float,
    backend: str,
    scale: str = "sqrt",
    progress: gr.Progress = gr.Progress(),
) -> tuple:
    """Run the model once; store the run; return the match score, the overview and the run."""
    try:
        progress(0.05, desc="Reading the photo")
        data = read_image(image_path)
        text = query_text(query)
        controls = controls_from(s_info, s_persp, s_part, k, budget)  # numbers only, never converted
        image = views.display_image(
            load_image(data, side=views.DISPLAY_SIDE)
        )  # a big JPEG is reduced while decoding
        chosen = _backend(backend)
        progress(0.25, desc=progress_note(chosen))
        result = service.infer(data, text, controls, chosen)
    except Exception as e:
        raise user_error(e) from e
    run = Run(image=image, result=result, scale=scale or "sqrt")
    match = views.match_html(result)
    return (match, match, *views.overview(run), run, "Drawing the other views below…")


def run_without_query(
    run: Run | None, image_path: str | None, s_info: float, s_persp: float, backend: str
) -> Run | None:
    """The same photo with the participatory scorer off (query impact); one more model call."""
    if run is None:
        return None
    r = run.result
    if abs(float(r.balance[2])) < 1e-9:  # the participatory scorer was off already
        return replace(run, without_query=r)
    try:
        c = Controls(float(s_info), float(s_persp), 0.0, r.k, r.token_budget)  # the user's other scales
        without = service.infer(read_image(image_path), r.query, c, _backend(backend))
    except Exception as e:  # the main views are already shown; say why this one is missing
        gr.Warning(f"Query impact unavailable: {e}")
        return run
    return replace(run, without_query=without)


def new_photo() -> tuple:
    """Another photo (or an example) was chosen: the results beside it belonged to the last one."""
    waiting = views.match_html(None)
    return (
        waiting,
        waiting,
        None,
        None,
        None,
        "A new photo: type a query (or keep this one) and press **Run**.",
    )


def set_scale(run: Run | None, scale: str) -> tuple:
    """Another colour scale: the stored run redrawn (overview and query impact; the rest follows)."""
    if run is None:
        return (None, *(gr.skip(),) * 3)
    run = replace(run, scale=scale)
    return (run, views.overview(run)[1], *views.impact_view(run)[:2])


def render_views(run: Run | None, map_label: str, opacity: float) -> tuple:
    if run is None:
        return (None,) * 24
    return (
        *views.homunculus_view(run),
        *views.three_ways(run),
        views.overlay_view(run, map_label, opacity),
        *views.texture_view(run),
        *views.budget_view(run),
        *views.comparison_view(run),
        *views.foveated_view(run),
        *views.metrics_view(run),
        *views.attribution_view(run),
    )


def render_impact(run: Run | None) -> tuple:
    if run is None:
        return None, None, None, "", ""
    ready = f"All views are drawn for “{run.result.query}”: pick one in the tabs below."
    return (*views.impact_view(run), ready)


@dataclass
class InferenceTab:
    image: gr.Image
    query: gr.Textbox
    run: gr.Button
    scales: list[gr.Slider]
    k: gr.Slider
    budget: gr.Slider
    backend: gr.Dropdown
    examples: gr.Examples  # a click loads its photo and query, then runs them as Run does


def build_inputs(settings: Settings, variant: Variant) -> InferenceTab:
    """The photo, the query, Run, the examples and the controls (the left column)."""
    c = variant.config
    image = photo_input(label="Photo", sources=["upload", "clipboard"], height=300, elem_id="photo")
    _caption(
        f"JPEG, PNG, WebP, … up to {_mb(settings.limits.max_image_bytes)}. Any size: large photos are scaled down, and the "
        f"model sees every photo at {c.image_size}×{c.image_size}."
    )
    query = gr.Textbox(
        label="Query",
        placeholder="what should the model look for? e.g. the red one",
        elem_id="query",
        max_lines=4,
        info=f"up to {settings.limits.max_query_chars} characters; colours, positions and text work best",
    )
    run = gr.Button("Run", variant="primary", elem_id="run")
    examples = gr.Examples(
        [[str(EXAMPLES_DIR / f), q] for f, q, _ in EXAMPLES],
        [image, query],
        elem_id="examples",
        example_labels=[label for _, _, label in EXAMPLES],
        examples_per_page=len(EXAMPLES),
        label="Examples",
    )
    _caption(EXAMPLES_NOTE)
    with gr.Accordion("Controls", open=False):
        with gr.Row():
            scales = [
                gr.Slider(0, 3, value=1.0, step=0.05, label=f"{n} scale")
                for n in ("information", "perspectival", "participatory")
            ]
        with gr.Row():
            k = gr.Slider(
                1, c.grid * c.grid, value=c.k, step=1, label=f"K (cells kept, of {c.grid * c.grid})"
            )
            budget = gr.Slider(
                MIN_CELL_TOKENS * 16,
                MAX_CELL_TOKENS * c.grid * c.grid,
                value=c.token_budget,
                step=256,
                label="token budget",
                info=f"≥ {MIN_CELL_TOKENS} × K",
            )
        default = (
            SERVER_DEFAULT
            if settings.service.broker_url
            else f"{SERVER_DEFAULT} ({service.served_backend()})"
        )
        backend = gr.Dropdown(
            [(default, SERVER_DEFAULT), *((BACKEND_LABELS.get(b, b), b) for b in BACKENDS)],
            value=SERVER_DEFAULT,
            label="backend",
            elem_id="backend",
            info="the engine that runs the model; the Benchmark tab compares them",
        )
    return InferenceTab(image, query, run, scales, k, budget, backend, examples)


def build_inference_tab(settings: Settings, variant: Variant) -> tuple[InferenceTab, Views]:
    """Inputs and the overview side by side; the match score above the overview and above the other
    views, so every view shows it."""
    with gr.Tab("Inference", id="infer"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=380):
                inputs = build_inputs(settings, variant)
            with gr.Column(scale=3, elem_id="results"):
                match = [gr.HTML(views.match_html(None), elem_id="match")]
                overview, scale, status = overview_block()
        with gr.Column(elem_id="views-section"):
            gr.Markdown("### Every view of the run", elem_id="views-title")
            match.append(gr.HTML(views.match_html(None), elem_id="match-views"))
            rest, map_in, opacity, ovl, impact = view_tabs()
    return inputs, Views(overview, status, scale, match, rest, map_in, opacity, ovl, impact)


def wire_inference(inp: InferenceTab, v: Views) -> None:
    state = gr.State(None)
    run_in = [inp.image, inp.query, *inp.scales, inp.k, inp.budget, inp.backend, v.scale]
    run_out = [*v.match, *v.overview, state, v.status]
    # Run and a click on an example share one queue slot ("run") and the same views after it
    shared: dict[str, Any] = dict(
        concurrency_limit=2,
        concurrency_id="run",
        scroll_to_output=True,
        show_progress_on=[v.match[0], v.overview[1]],
    )
    ran = inp.run.click(
        run_model,
        run_in,
        run_out,
        api_name="run",
        api_description="Run the model on one photo and query with the page's controls: (photo, query, information "
        "scale, perspectival scale, participatory scale, K, token budget, backend or 'server default', "
        "colour scale) -> the match score, the photo, the relevance map, the selected cells and a summary.",
        **shared,
    )
    # the page says "press Run — or click an example": the example's photo and query are in place
    # when this runs (Gradio loads them first, in the click's own event)
    ran_example = inp.examples.load_input_event.then(run_model, run_in, run_out, **shared, **PRIVATE)
    inp.query.submit(lambda: None, None, None, js="() => document.querySelector('#run').click()", **PRIVATE)
    inp.image.change(  # not queued: an example's run, queued after it, must not be wiped by it
        new_photo,
        None,
        [*v.match, *v.overview],
        show_progress="hidden",
        js=CLOSE_ERRORS_JS,
        queue=False,
        **PRIVATE,
    )  # no stale results (or "Upload a photo first") beside it
    for event in (ran, ran_example):
        event.success(render_views, [state, v.map, v.opacity], v.rest, **PRIVATE).then(
            run_without_query, [state, inp.image, *inp.scales[:2], inp.backend], state, **PRIVATE
        ).then(render_impact, state, [*v.impact, v.status], **PRIVATE)
    v.scale.change(
        set_scale, [state, v.scale], [state, v.overview[1], *v.impact[:2]], show_progress="hidden", **PRIVATE
    ).then(render_views, [state, v.map, v.opacity], v.rest, show_progress="hidden", **PRIVATE)
    gr.on(
        [v.map.change, v.opacity.change],
        views.overlay_view,
        [state, v.map, v.opacity],
        v.overlay,
        show_progress="hidden",
        **PRIVATE,
    )
