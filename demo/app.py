"""ARR-COC Serve demo: Gradio 6 Blocks. Constants, typed handlers, one small builder per tab, main().

    python -m demo.app            # or: arrcoc demo --port 7860
Nothing heavy happens at import: the executor (and with it the model) is built on the first run.
Every number the page shows about the model (grid, K, token budget) comes from the serving
variant's config; every limit from the settings.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from arrcoc.errors import ArrcocError, InvalidInputError
from arrcoc.images import load_image
from arrcoc.registry import default_weights_path, get_variant, list_variants
from arrcoc.render import overlay
from arrcoc.request import MAX_CELL_TOKENS, MIN_CELL_TOKENS, Controls, validate_query
from arrcoc.result import WEAK_MATCH
from arrcoc.service.jobs.archive import MANIFEST_NAMES
from arrcoc.service.jobs.types import JobKind, JobState
from arrcoc.settings import BACKENDS, Settings, get_settings
from arrcoc.variant import Variant

from . import batchview, charts, jobs, service, views
from .views import Run

log = logging.getLogger("arrcoc.demo")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = ROOT / "arrcoc" / "examples"
# (photo, query, label): each checked on the default model (arrcoc-texture, eager, CPU) by looking
# at where its top cells fall; the last shows what the model cannot do.
EXAMPLES = [  # tests/test_demo_views.py checks that each still lands where its label says
    ("chelsea.jpg", "the black one", "colour · the black one (pupils)"),
    ("coffee.jpg", "the red one", "colour · the red one (the cup)"),
    ("astronaut.jpg", "the orange one", "colour · the orange one (suit)"),
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
API_OVERLAY_SIDE = 2048  # /infer's overlay: the photo's own size, unless a big JPEG reduces to about this while decoding
SERVER_DEFAULT = "server default"  # the backend dropdown's first choice: sends None (ARRCOC_BACKEND)
BACKEND_LABELS = {
    "eager": "eager (PyTorch)",
    "compiled": "compiled (torch.compile + CUDA graphs)",
    "onnx": "onnx (ONNX Runtime)",
    "aot": "aot (AOTInductor packages)",
}
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
        "CLIP ViT-B/16's image and text towers (OpenAI CLIP, trained on 400M web image–text pairs) with MaskCLIP dense "
        "patch features on a 14×14 grid, coarser than the texture model's. CLIP names **object categories** "
        "(“the cat”, “the coffee cup”), so MaskCLIP-style maps are expected to find them (the literature's finding; "
        "this project has not measured it with the real weights). Its weights come from the Hugging Face hub or a local copy."
    ),
}
MODEL_NOTES["arrcoc-clip-b16-448"] = MODEL_NOTES["arrcoc-clip-b16"].replace("14×14", "28×28")
TITLE = "ARR-COC Serve — query-aware visual relevance"
CSS = """
.arr-legend {display:flex; align-items:center; gap:8px; font-size:0.85em; margin:2px 4px;}
.arr-legend-title {font-weight:600; margin-right:4px;}
.arr-legend-bar {flex:1; height:12px; border-radius:3px; min-width:120px;}
.arr-progress {position:relative; height:22px; background:var(--block-background-fill);
  border:1px solid var(--border-color-primary); border-radius:6px; overflow:hidden;}
.arr-progress-fill {height:100%; background:linear-gradient(90deg,#6366f1,#f59e0b); transition:width .4s;}
.arr-progress span {position:absolute; inset:0; text-align:center; font-size:0.85em; line-height:22px;}
.arr-caption {color: var(--body-text-color-subdued); font-size: 0.9em;}
.arr-match {padding:8px 12px; border-radius:8px; font-size:0.95em; border:1px solid var(--border-color-primary);}
.arr-match-ok {background: rgba(22,163,74,0.10); border-color: rgba(22,163,74,0.5);}
.arr-match-weak {background: rgba(245,158,11,0.16); border-color: rgba(217,119,6,0.7);}
.arr-match-none {color: var(--body-text-color-subdued);}
.arr-gallery {display:grid; grid-template-columns:repeat(auto-fill, minmax(220px, 1fr)); gap:12px;}
.arr-item {margin:0; padding:8px; border:1px solid var(--border-color-primary); border-radius:8px;
  background: var(--block-background-fill);}
.arr-item img {width:100%; height:180px; object-fit:contain; display:block;}
.arr-item figcaption {font-size:0.85em; line-height:1.35; margin-top:6px; overflow-wrap:anywhere;}
.arr-weak {color:#b45309; font-weight:600;}
.arr-texture .fixed-height {min-height: 0 !important; max-height: none !important;}
.arr-texture .grid-wrap {overflow-y: visible !important;}
"""
CHANNEL_GROUP_LABELS = ("colour: R, G, B, L*, a*, b*", "edges: Sobel x, y, magnitude, contrast", "position: y, x, eccentricity")
THEME = gr.themes.Soft(primary_hue="indigo", secondary_hue="amber")
PUSH_JOB_JS = "(id) => { const u = new URL(window.location); if (id) { u.searchParams.set('job', id); window.history.replaceState(null, '', u); } }"
PRIVATE: dict[str, Any] = {"api_visibility": "private"}


def _mb(n: int) -> str:
    return f"{n / 1024 / 1024:.0f} MB"


def serving_variant(settings: Settings | None = None) -> Variant:
    return get_variant((settings or get_settings()).variant)


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
        report = json.loads(path.with_name(path.name.removesuffix(".safetensors") + ".report.json").read_text())
        return float(report["accuracy"]["trained"]["overall"])
    except (AttributeError, OSError, ValueError, KeyError, TypeError):
        return None


def model_note(variant: Variant) -> str:
    score = pointing_game(variant)
    pointing = (f" Its pointing game, **{score:.3f}**, is measured on held-out **synthetic** scenes, not on photos "
                "(the training report is beside its weights)." if score is not None else "")  # fmt: skip
    what = MODEL_NOTES.get(variant.name, f"{variant.description}.").replace("{pointing}", pointing)
    c = variant.config
    return (
        f"**`{variant.name}`**: {variant.description}. Images are resized to {c.image_size}×{c.image_size} "
        f"({c.grid}×{c.grid} cells; a cell is 1/{c.grid} of the photo's width and height, so a 600×400 photo's "
        f"cell is {600 / c.grid:.3g}×{400 / c.grid:.3g} px).\n\n{what}\n\n"
        "The **match score** (0–1) says how well the query matched this photo at its best cell, comparable across "
        f"photos; below {WEAK_MATCH:.2f} is a weak match: the map is then mostly noise, however bright its peak (every "
        "map is scaled to its own peak). It is not yet calibrated on real photos: read it as higher = better. The full model card — training data, what each variant grounds, evaluation — is `docs/model.md` in "
        "the repository."
    )


def photo_input(**kwargs: Any) -> gr.Image:
    """A filepath gr.Image that passes files Pillow cannot open on to our own checks (load_image),
    which explain the problem in words instead of failing inside Gradio's preprocessing."""
    comp = gr.Image(type="filepath", image_mode=None, **kwargs)
    strict = comp.preprocess

    def lenient(payload):
        try:
            return strict(payload)
        except Exception:
            return str(payload.path) if payload is not None and payload.path else None

    comp.preprocess = lenient  # type: ignore[method-assign]
    return comp


# ---- handlers: inference -----------------------------------------------------------------------


def _read_image(path: str | None) -> bytes:
    if not path:
        raise InvalidInputError("Upload a photo first (or click one of the examples).")
    return Path(path).read_bytes()


def _user_error(e: Exception) -> gr.Error:
    """A user's mistake: one log line and their message. A fault: the traceback (once, in our log),
    and a plain message. Gradio prints no second traceback for either (print_exception=False)."""
    if isinstance(e, ArrcocError):
        log.info("refused: %s: %s", type(e).__name__, e)
        return gr.Error(str(e), title="Cannot run that", print_exception=False)
    log.exception("demo handler failed")
    return gr.Error("Something went wrong on the server. Try again; details are in the server log.", print_exception=False)


def _backend(choice: str | None) -> str | None:
    """The dropdown's choice as a request's backend: None (the server's own) for "server default"."""
    return None if not choice or choice == SERVER_DEFAULT else choice


def _query(query: str | None) -> str:
    """The query as typed, checked for length here: the text box never cuts it silently."""
    text = jobs.text_field(query, "The query")  # a number or a list is refused, not turned into text
    return validate_query(text, get_settings().max_query_chars)  # the same checks and words as the service


def progress_note(backend: str | None) -> str:
    """What the next model call will spend its time on, in words."""
    name = backend or service.served_backend()
    if service.is_ready(name):
        return f"Running the model ({name})"
    if name in ("compiled", "aot"):
        return (f"First use of `{name}` on this server: compiling the model (one program for single images, one for batches) "
                "(about a minute on a CPU; later runs take milliseconds)")  # fmt: skip
    return "Loading the model and the query encoder (first run on this server only)"


def run_model(
    image_path: str | None, query: str, s_info: float, s_persp: float, s_part: float, k: float,
    budget: float, backend: str, scale: str = "sqrt", request: gr.Request = None, progress: gr.Progress = gr.Progress(),
) -> tuple:  # fmt: skip
    """Run the model once; store the run; return the match score, the overview and the run."""
    try:
        progress(0.05, desc="Reading the photo")
        jobs.rate_limit(request, "infer")
        data = _read_image(image_path)
        text = _query(query)
        controls = jobs.controls_from(s_info, s_persp, s_part, k, budget)  # numbers only, never converted
        image = views.display_image(load_image(data, side=views.DISPLAY_SIDE))  # a big JPEG is reduced while decoding
        chosen = _backend(backend)
        progress(0.25, desc=progress_note(chosen))
        result = service.infer(data, text, controls, chosen)
    except Exception as e:
        raise _user_error(e) from e
    run = Run(image=image, result=result, scale=scale or "sqrt")
    match = views.match_html(result)
    return (match, match, *views.overview(run), run, "Drawing the other views below…")


def run_without_query(run: Run | None, image_path: str | None, s_info: float, s_persp: float, backend: str) -> Run | None:
    """The same photo with the participatory scorer off (query impact); one more model call."""
    if run is None:
        return None
    r = run.result
    if abs(float(r.balance[2])) < 1e-9:  # the participatory scorer was off already
        return replace(run, without_query=r)
    try:
        c = Controls(float(s_info), float(s_persp), 0.0, r.k, r.token_budget)  # the user's other scales
        without = service.infer(_read_image(image_path), r.query, c, _backend(backend))
    except Exception as e:  # the main views are already shown; say why this one is missing
        gr.Warning(f"Query impact unavailable: {e}")
        return run
    return replace(run, without_query=without)


def new_photo() -> tuple:
    """Another photo (or an example) was chosen: the results beside it belonged to the last one."""
    waiting = views.match_html(None)
    return (waiting, waiting, None, None, None, "A new photo: type a query (or keep this one) and press **Run**.")


def set_scale(run: Run | None, scale: str) -> tuple:
    """Another colour scale: the stored run redrawn (overview and query impact; the rest follows)."""
    if run is None:
        return (None, *(gr.skip(),) * 3)
    run = replace(run, scale=scale)
    return (run, views.overview(run)[1], *views.impact_view(run)[:2])


def render_views(run: Run | None, map_label: str, opacity: float) -> tuple:
    if run is None:
        return (None,) * 22
    return (
        *views.homunculus_view(run),
        *views.three_ways(run),
        views.overlay_view(run, map_label, opacity),
        *views.texture_view(run),
        *views.budget_view(run),
        *views.comparison_view(run),
        *views.metrics_view(run),
        *views.attribution_view(run),
    )


def render_impact(run: Run | None) -> tuple:
    if run is None:
        return None, None, None, "", ""
    ready = f"All views are drawn for “{run.result.query}”: pick one in the tabs below."
    return (*views.impact_view(run), ready)


def api_infer(image_path: str | None, query: str, request: gr.Request = None) -> tuple[dict[str, Any], Any]:
    try:
        jobs.rate_limit(request, "infer")
        data = _read_image(image_path)
        result = service.infer(data, _query(query), Controls())
        return result.to_json(), overlay(load_image(data, side=API_OVERLAY_SIDE), result.relevance)
    except Exception as e:
        raise _user_error(e) from e


# ---- handlers: batch -----------------------------------------------------------------------------


def batch_submit(zip_path: str | None, manifest_path: str | None, query: str, token: str | None = None,
                 request: gr.Request = None) -> tuple[str, str, str, gr.Timer]:  # fmt: skip
    try:
        owner = jobs.owner_of(request, token, "batch")  # the job is bound to this token, browser or session
        jobs.rate_limit(request, "jobs", token)
        job_id = jobs.submit_batch(zip_path, manifest_path, query, Controls(), owner=owner)
    except Exception as e:
        raise _user_error(e) from e
    gr.Info(f"Batch job {job_id} submitted.")
    return job_id, f"batch job `{job_id}` submitted", jobs.progress_html(None), gr.Timer(active=True)


def batch_poll(job_id: str, token: str | None = None, request: gr.Request = None) -> tuple:
    """The page's poll: status, bar, results file, gallery, failures, timer."""
    keep = (gr.skip(), gr.skip())
    if not job_id or (isinstance(job_id, str) and not job_id.strip()):
        return ("Submit a batch or paste a job id.", jobs.progress_html(None), None, *keep, gr.Timer(active=False))
    try:
        owner = jobs.owner_of(request, token, "batch")
        st = jobs.job_status(job_id, owner)
        file = jobs.batch_results_file(st.job_id, owner) if st.state == JobState.DONE else None
    except Exception as e:
        return (f"**Error:** {jobs.friendly(e)}", jobs.progress_html(None), None, *keep, gr.Timer(active=False))
    shown = batchview.gallery(file) if file else ("", batchview.failures_markdown([], st))
    return (jobs.status_markdown(st), jobs.progress_html(st), file, *shown, gr.Timer(active=not st.state.finished))


def api_batch_status(job_id: str, token: str | None = None, request: gr.Request = None) -> tuple[dict[str, Any], str | None]:
    try:
        owner = jobs.owner_of(request, token, "batch")
        st = jobs.job_status(job_id, owner)
        file = jobs.batch_results_file(st.job_id, owner) if st.state == JobState.DONE else None
    except Exception as e:
        raise _user_error(e) from e
    return batchview.status_json(st, file), file


def batch_cancel(job_id: str, token: str | None = None, request: gr.Request = None) -> str:
    try:
        owner = jobs.owner_of(request, token, "batch")
        st = service.executor().cancel(jobs.text_field(job_id, "The job id").strip(), owner=owner)
    except Exception as e:
        raise _user_error(e) from e
    return jobs.status_markdown(st)


def on_load(request: gr.Request) -> tuple[str, gr.Timer, str, gr.Timer, Any]:
    """?job=ID in the URL shows that job again (batch or benchmark) after a refresh."""
    job_id = (request.query_params.get("job") or "").strip() if request else ""
    if not job_id:
        return "", gr.Timer(active=False), "", gr.Timer(active=False), gr.Tabs()
    try:
        kind = jobs.job_status(job_id, jobs.owner_of(request, None, "batch")).kind
    except Exception:
        kind = JobKind.BATCH
    if kind == JobKind.BENCH:
        return "", gr.Timer(active=False), job_id, gr.Timer(active=True), gr.Tabs(selected="bench")
    return job_id, gr.Timer(active=True), "", gr.Timer(active=False), gr.Tabs(selected="batch")


# ---- handlers: benchmark ---------------------------------------------------------------------------


def gpu_note() -> str:
    if get_settings().broker_url:
        return "Benchmarks run on a GPU worker of the queue (this page does not see its device)."
    if torch.cuda.is_available():
        return f"GPU: **{torch.cuda.get_device_name(0)}**."
    return ("**No GPU on this server**: benchmarks run on the CPU. The `cuda` device is unavailable and "
            "`compiled` runs without CUDA graphs (compiling on CPU takes a while).")  # fmt: skip


def bench_submit(variant: str, backends: list[str], buckets: list[str], iterations: float, device: str,
                 token: str | None = None, request: gr.Request = None) -> tuple[str, str, gr.Timer]:  # fmt: skip
    if device == "cuda" and not torch.cuda.is_available() and not get_settings().broker_url:
        raise gr.Error("No GPU is visible on this server: choose the cpu (or auto) device.", title="GPU only", print_exception=False)
    try:
        owner = jobs.owner_of(request, token, "bench")  # ARRCOC_TOKEN_SCOPE=bench: token holders only
        jobs.rate_limit(request, "jobs", token)
        job_id = jobs.submit_bench(variant, backends, buckets, iterations, device, owner=owner)
    except Exception as e:
        raise _user_error(e) from e
    return job_id, f"benchmark job `{job_id}` submitted", gr.Timer(active=True)


def _report_outputs(report: dict[str, Any] | None, source: str) -> tuple:
    df = jobs.report_frame(report)
    files = jobs.report_files(report, Path(source.split()[-1]).stem or "report") if report else None
    return (jobs.report_markdown(report, source), gr.Column(visible=report is not None), df,
            *charts.report_figures(df), files)  # fmt: skip


def bench_poll(job_id: str, token: str | None = None, request: gr.Request = None) -> tuple:
    keep = (gr.skip(),) * 7
    if not job_id or (isinstance(job_id, str) and not job_id.strip()):
        return ("", gr.Timer(active=False), *keep)
    try:
        owner = jobs.owner_of(request, token, "bench")
        st = jobs.job_status(job_id, owner)
        if st.state != JobState.DONE:
            return (jobs.status_markdown(st), gr.Timer(active=not st.state.finished), *keep)
        report = service.executor().bench_report(st.job_id, owner=owner)
    except Exception as e:
        return (f"**Error:** {jobs.friendly(e)}", gr.Timer(active=False), *keep)
    return (jobs.status_markdown(st), gr.Timer(active=False), *_report_outputs(report, f"job {st.job_id}"))


def load_last_report() -> tuple:
    names = jobs.stored_reports()
    return (gr.Dropdown(choices=names, value=names[0] if names else None), *show_stored_report(names[0] if names else ""))


def show_stored_report(name: str) -> tuple:
    report = jobs.stored_report(name)
    return _report_outputs(report, f"Stored report: benchmarks/{name}" if report else "")


# ---- the page: one builder per tab ---------------------------------------------------------------


def _md(text: str) -> str:
    return text.replace("*", "\\*")


def _caption(text: str) -> gr.Markdown:
    return gr.Markdown(text, elem_classes="arr-caption")


@dataclass
class InferenceTab:
    image: gr.Image
    query: gr.Textbox
    run: gr.Button
    scales: list[gr.Slider]
    k: gr.Slider
    budget: gr.Slider
    backend: gr.Dropdown


def build_inputs(settings: Settings, variant: Variant) -> InferenceTab:
    """The photo, the query, Run, the examples and the controls (the left column)."""
    c = variant.config
    image = photo_input(label="Photo", sources=["upload", "clipboard"], height=300, elem_id="photo")
    _caption(f"JPEG, PNG, WebP, … up to {_mb(settings.max_image_bytes)}. Any size: large photos are scaled down, and the "
             f"model sees every photo at {c.image_size}×{c.image_size}.")  # fmt: skip
    query = gr.Textbox(label="Query", placeholder="what should the model look for? e.g. the red one", elem_id="query", max_lines=4,
                       info=f"up to {settings.max_query_chars} characters; colours, positions and text work best")  # fmt: skip
    run = gr.Button("Run", variant="primary", elem_id="run")
    gr.Examples([[str(EXAMPLES_DIR / f), q] for f, q, _ in EXAMPLES], [image, query], elem_id="examples",
                example_labels=[label for _, _, label in EXAMPLES], examples_per_page=len(EXAMPLES), label="Examples")
    _caption(EXAMPLES_NOTE)
    with gr.Accordion("Controls", open=False):
        with gr.Row():
            scales = [gr.Slider(0, 3, value=1.0, step=0.05, label=f"{n} scale") for n in ("information", "perspectival", "participatory")]
        with gr.Row():
            k = gr.Slider(1, c.grid * c.grid, value=c.k, step=1, label=f"K (cells kept, of {c.grid * c.grid})")
            budget = gr.Slider(MIN_CELL_TOKENS * 16, MAX_CELL_TOKENS * c.grid * c.grid, value=c.token_budget, step=256,
                               label="token budget", info=f"≥ {MIN_CELL_TOKENS} × K")  # fmt: skip
        default = SERVER_DEFAULT if settings.broker_url else f"{SERVER_DEFAULT} ({service.served_backend()})"
        backend = gr.Dropdown([(default, SERVER_DEFAULT), *((BACKEND_LABELS.get(b, b), b) for b in BACKENDS)],
                              value=SERVER_DEFAULT, label="backend", elem_id="backend",
                              info="the engine that runs the model; the Benchmark tab compares them")  # fmt: skip
    return InferenceTab(image, query, run, scales, k, budget, backend)


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


def _overview() -> tuple[list[Any], gr.Radio, gr.Markdown]:
    """Photo, relevance and selected cells, beside the inputs: in view as soon as Run returns."""
    with gr.Column(elem_id="overview"):
        with gr.Row():
            photo = gr.Image(label="photo", interactive=False, buttons=["fullscreen"])
            heat = gr.Image(label="relevance", interactive=False, format="png", elem_id="relevance-map", buttons=["download", "fullscreen"])
            sel = gr.Image(label="selected cells", interactive=False, buttons=["fullscreen"])
        with gr.Row(equal_height=True):
            gr.HTML(views.colourbar_html("low", "high (the map's peak)", "relevance"))
            scale = gr.Radio([(k, v) for k, v in views.SCALES.items()], value="sqrt", label="colour scale (every map)", elem_id="scale")
        md = gr.Markdown("Upload a photo, type a query and press **Run** — or click an example.", elem_id="summary")
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
            maps = [gr.Image(label=n, interactive=False, format="png") for n in ("information", "perspectival", "participatory (query)", "balanced relevance")]
        gr.HTML(views.colourbar_html("low", "high (each map's peak)", "score"))
        return [*maps, gr.Markdown()]


def _overlays_tab() -> tuple[gr.Radio, gr.Slider, gr.Image]:
    with gr.Tab("Overlays", id="overlays"):
        with gr.Row():
            map_in = gr.Radio(list(views.MAPS), value="relevance (balanced)", label="map")
            opacity = gr.Slider(0, 1, value=0.55, step=0.05, label="opacity")
        image = gr.Image(label="overlay", interactive=False, height=420, elem_id="overlay")
        gr.HTML(views.colourbar_html("low", f"high (the map's peak; token budget: {MAX_CELL_TOKENS})", "map value"))
    return map_in, opacity, image


def _texture_tab() -> list[Any]:
    with gr.Tab("Texture", id="texture"):
        _caption("The 13 per-cell features the scorers read. Each tile is coloured from its own minimum to its own "
                 "maximum, given in brackets under its name.")  # fmt: skip
        style = dict(height="auto", object_fit="contain", allow_preview=True, elem_classes="arr-texture", show_label=False)
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
        _caption(f"Level of detail: vision tokens per cell ({MIN_CELL_TOKENS}–{MAX_CELL_TOKENS} for kept cells, 0 for the rest).")
        with gr.Row():
            with gr.Column():
                image = gr.Image(label="tokens per cell", interactive=False, format="png")
                gr.HTML(views.colourbar_html("0", f"{MAX_CELL_TOKENS} tokens", "budget"))
            plot = gr.Plot(show_label=False, label="tokens by relevance rank", elem_id="budget-chart")
        return [image, gr.Markdown(), plot]


def _compare_tab() -> list[Any]:
    with gr.Tab("vs uniform", id="compare"):
        _caption("Where the same K cells go: chosen by this query's relevance, or on a query-blind uniform lattice.")
        with gr.Row():
            ours = gr.Image(label="ARR-COC", interactive=False)
            base = gr.Image(label="uniform lattice", interactive=False)
        md = gr.Markdown()
        table = gr.DataFrame(label="how the kept cells spread", interactive=False)
        return [ours, base, table, md]


def _metrics_tab() -> list[Any]:
    with gr.Tab("Metrics", id="metrics"):
        _caption("How the kept cells spread over the image (regions: a 4×4 split of the grid).")
        with gr.Row():
            table = gr.DataFrame(label="metrics", interactive=False, elem_id="metrics-table", scale=3)
            image = gr.Image(label="kept cells per region (brighter: more)", interactive=False, scale=2)
        return [table, image]


def _impact_tab() -> list[Any]:
    with gr.Tab("Query impact", id="impact"):
        _caption("With the query vs without the participatory scorer (its scale set to 0): one extra model call.")
        with gr.Row():
            with_q = gr.Image(label="relevance with the query", interactive=False)
            without = gr.Image(label="without the participatory scorer", interactive=False)
            change = gr.Image(label="selection change", interactive=False)
        return [with_q, without, change, gr.Markdown(elem_id="impact-summary")]


def _attribution_tab() -> list[Any]:
    with gr.Tab("Attribution", id="attribution"):
        return [gr.Plot(show_label=False, label="channel attribution", elem_id="attribution-chart"), gr.Markdown()]


def _view_tabs() -> tuple[list[Any], gr.Radio, gr.Slider, gr.Image, list[Any]]:
    """One tab per view, full width under the inputs and the overview."""
    with gr.Tabs(elem_id="views"):
        hom, three = _homunculus_tab(), _three_ways_tab()
        map_in, opacity, ovl = _overlays_tab()
        rest = [*hom, *three, ovl, *_texture_tab(), *_budget_tab(), *_compare_tab(), *_metrics_tab()]
        impact = _impact_tab()
        rest += _attribution_tab()
    return rest, map_in, opacity, ovl, impact


def build_inference_tab(settings: Settings, variant: Variant) -> tuple[InferenceTab, Views]:
    """Inputs and the overview side by side; the match score above the overview and above the other
    views, so every view shows it."""
    with gr.Tab("Inference", id="infer"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=2, min_width=380):
                inputs = build_inputs(settings, variant)
            with gr.Column(scale=3, elem_id="results"):
                match = [gr.HTML(views.match_html(None), elem_id="match")]
                overview, scale, status = _overview()
        with gr.Column(elem_id="views-section"):
            gr.Markdown("### Every view of the run", elem_id="views-title")
            match.append(gr.HTML(views.match_html(None), elem_id="match-views"))
            rest, map_in, opacity, ovl, impact = _view_tabs()
    return inputs, Views(overview, status, scale, match, rest, map_in, opacity, ovl, impact)


def wire_inference(inp: InferenceTab, v: Views) -> None:
    state = gr.State(None)
    ran = inp.run.click(
        run_model, [inp.image, inp.query, *inp.scales, inp.k, inp.budget, inp.backend, v.scale],
        [*v.match, *v.overview, state, v.status], api_name="run", concurrency_limit=2, scroll_to_output=True,
        show_progress_on=[v.match[0], v.overview[1]],
        api_description="Run the model on one photo and query with the page's controls: (photo, query, information "
                        "scale, perspectival scale, participatory scale, K, token budget, backend or 'server default', "
                        "colour scale) -> the match score, the photo, the relevance map, the selected cells and a summary.",
    )  # fmt: skip
    inp.query.submit(lambda: None, None, None, js="() => document.querySelector('#run').click()", **PRIVATE)
    inp.image.change(new_photo, None, [*v.match, *v.overview], show_progress="hidden", **PRIVATE)  # no stale results beside it
    ran.success(render_views, [state, v.map, v.opacity], v.rest, **PRIVATE).then(
        run_without_query, [state, inp.image, *inp.scales[:2], inp.backend], state, **PRIVATE
    ).then(render_impact, state, [*v.impact, v.status], **PRIVATE)
    v.scale.change(set_scale, [state, v.scale], [state, v.overview[1], *v.impact[:2]], show_progress="hidden", **PRIVATE).then(
        render_views, [state, v.map, v.opacity], v.rest, show_progress="hidden", **PRIVATE
    )
    gr.on([v.map.change, v.opacity.change], views.overlay_view, [state, v.map, v.opacity], v.overlay,
          show_progress="hidden", **PRIVATE)  # fmt: skip


def build_batch_tab(settings: Settings) -> tuple[gr.Textbox, gr.Timer]:
    with gr.Tab("Batch", id="batch"):
        _caption(f"Many images, one query (or a manifest with a query per file). Zips up to {_mb(settings.max_image_bytes)} "
                 "here (larger: `arrcoc submit`). Jobs keep running if you close the page: keep the job id (it is also in "
                 "the address bar) to come back to it.")  # fmt: skip
        with gr.Row():
            with gr.Column():
                zip_in = gr.File(label="images (.zip)", file_types=[".zip"], elem_id="batch-zip")
                names = " or ".join(MANIFEST_NAMES)
                manifest = gr.File(label=f"manifest (optional: .csv or .jsonl with file,query; or {names} inside the zip)",
                                   file_types=[Path(n).suffix for n in MANIFEST_NAMES])  # fmt: skip
                query = gr.Textbox(label="query for every image", placeholder="e.g. the red one", elem_id="batch-query")
                token = gr.Textbox(label="API token", type="password", visible=settings.token_required("batch"),
                                   elem_id="batch-token")  # fmt: skip
                submit = gr.Button("Submit batch", variant="primary", elem_id="batch-submit")
            with gr.Column():
                with gr.Row():
                    job = gr.Textbox(label="job id", placeholder="paste a job id to see it again", elem_id="batch-job", scale=3)
                    show = gr.Button("Show job", scale=1)
                    cancel = gr.Button("Cancel", variant="stop", scale=1)
                bar = gr.HTML(jobs.progress_html(None), elem_id="batch-progress")
                status = gr.Markdown("No job yet.", elem_id="batch-status")
                file = gr.File(label="results (.zip: overlays, results.parquet, summary.csv)", interactive=False, elem_id="batch-results")
        gr.Markdown("**Results**: each overlay with its file, query, match score and most relevant cell; failed items "
                    "are listed under it with their reason.", elem_classes="arr-caption")  # fmt: skip
        gallery = gr.HTML(elem_id="batch-gallery")
        failures = gr.Markdown(elem_id="batch-failures")
        timer = gr.Timer(1.0, active=False)
        with gr.Row(visible=False):  # the /batch_status API endpoint's own components
            api_job, api_json, api_file, api_btn = gr.Textbox(), gr.JSON(), gr.File(), gr.Button()
            api_token = gr.Textbox(value="")

    submit.click(batch_submit, [zip_in, manifest, query, token], [job, status, bar, timer], api_name="batch_submit",
                 api_description="Submit a batch job: (images .zip, optional manifest .csv/.jsonl with file,query, query "
                                 "for every image) -> the job id (and a status line).").then(
        None, job, None, js=PUSH_JOB_JS, **PRIVATE)  # fmt: skip
    gr.on([show.click, job.submit, timer.tick], batch_poll, [job, token], [status, bar, file, gallery, failures, timer],
          show_progress="hidden", **PRIVATE)  # fmt: skip
    api_btn.click(api_batch_status, [api_job, api_token], [api_json, api_file], api_name="batch_status",
                  api_description="A batch job's status as JSON (state, counts, progress, message; when finished, one "
                                  "entry per item with file, query, match score, top cell as row and column, or the "
                                  "reason it failed) and the results .zip once it is ready.")  # fmt: skip
    show.click(None, job, None, js=PUSH_JOB_JS, **PRIVATE)
    cancel.click(batch_cancel, [job, token], status, api_name="batch_cancel",
                 api_description="Cancel a batch job by id -> its status line.")  # fmt: skip
    return job, timer


def build_bench_tab(settings: Settings) -> tuple:
    with gr.Tab("Benchmark", id="bench"):
        gr.Markdown(gpu_note(), elem_id="gpu-note")
        with gr.Row():
            with gr.Column():
                variant = gr.Dropdown(list_variants(), value=settings.variant, label="variant")
                backends = gr.CheckboxGroup(list(BACKENDS), value=["eager"], label="backends")
                buckets = gr.CheckboxGroup([str(b) for b in settings.buckets], value=["1"], label="batch buckets")
                iters = gr.Slider(1, 300, value=20, step=1, label="timed iterations")
                cuda_label = "cuda" if torch.cuda.is_available() or settings.broker_url else "cuda (no GPU here)"
                device = gr.Radio([("auto", "auto"), ("cpu", "cpu"), (cuda_label, "cuda")], value="auto", label="device")
                token = gr.Textbox(label="API token", type="password", visible=settings.token_required("bench"),
                                   elem_id="bench-token")  # fmt: skip
                submit = gr.Button("Run benchmark", variant="primary")
            with gr.Column():
                job = gr.Textbox(label="benchmark job id", placeholder="paste a benchmark job id to see it again")
                status = gr.Markdown("No benchmark job yet.", elem_id="bench-status")
        with gr.Row():
            title = gr.Markdown(elem_id="bench-report-title")
            stored = gr.Dropdown([], label="stored reports (benchmarks/*.json, newest first)", scale=0, min_width=360, elem_id="bench-stored")
        with gr.Column(visible=False) as results:
            table = gr.DataFrame(label="results", interactive=False, elem_id="bench-table")
            lat = gr.Plot(show_label=False, label="p50 latency by bucket", elem_id="bench-latency")
            with gr.Row():
                speed = gr.Plot(show_label=False, label="speedup vs eager", elem_id="bench-speedup")
                parity = gr.Plot(show_label=False, label="parity vs eager", elem_id="bench-parity")
            files = gr.File(label="download the report (JSON, CSV)", file_count="multiple", interactive=False)
        timer = gr.Timer(2.0, active=False)

    out = [title, results, table, lat, speed, parity, files]
    submit.click(bench_submit, [variant, backends, buckets, iters, device, token], [job, status, timer], api_name="bench_submit",
                 api_description="Submit a benchmark job: (variant, backends, batch buckets, timed iterations, device) "
                                 "-> the job id.").then(None, job, None, js=PUSH_JOB_JS, **PRIVATE)  # fmt: skip
    gr.on([timer.tick, job.submit], bench_poll, [job, token], [status, timer, *out], api_name="bench_status", show_progress="hidden",
          api_description="A benchmark job's status; when done, its report: title, results table, charts and files.")  # fmt: skip
    stored.input(show_stored_report, stored, out, **PRIVATE)
    return job, timer, stored, out


def build_api_infer() -> None:
    """The /infer endpoint: hidden components, for gradio_client and the "Use via API" page."""
    with gr.Row(visible=False):
        image, query = photo_input(label="image"), gr.Textbox()
        doc, picture, button = gr.JSON(label="result"), gr.Image(type="pil", format="png", label="overlay"), gr.Button()
    button.click(api_infer, [image, query], [doc, picture], api_name="infer",
                 api_description="One photo and a query with default controls -> (the result as JSON, the same keys as "
                                 "`arrcoc infer --json`, including match_score and weak_match; the relevance overlay PNG).")  # fmt: skip


def build_demo() -> gr.Blocks:
    settings = get_settings()
    variant = serving_variant(settings)
    # Gradio's cache (uploads, served results) is swept on the reaper's schedule
    with gr.Blocks(title=TITLE, delete_cache=(settings.reap_interval_s, settings.temp_max_age_s)) as demo:
        gr.Markdown(intro_markdown(settings, variant))
        with gr.Accordion("About the model: what it can and cannot find", open=False, elem_id="model-note"):
            gr.Markdown(model_note(variant))
        with gr.Tabs(elem_id="main-tabs") as tabs:
            inputs, shown = build_inference_tab(settings, variant)
            b_job, b_timer = build_batch_tab(settings)
            bn_job, bn_timer, bn_stored, bench_out = build_bench_tab(settings)
        build_api_infer()
        wire_inference(inputs, shown)
        demo.load(load_last_report, None, [bn_stored, *bench_out], **PRIVATE)
        demo.load(None, None, None, js=jobs.SET_CLIENT_COOKIE_JS, **PRIVATE)  # this browser's id: its jobs
        demo.load(on_load, None, [b_job, b_timer, bn_job, bn_timer, tabs], **PRIVATE)
    jobs.strict_inputs(demo)  # API values of the wrong type: a clear error, never converted
    return demo


def launch(demo: gr.Blocks | None = None, **kwargs: Any) -> tuple:
    """Launch with the product's theme, CSS and limits (Gradio 6 takes them in launch())."""
    demo = demo or build_demo()
    jobs.start_housekeeping()  # expired jobs' files and old temp files, on a schedule
    demo.queue(default_concurrency_limit=2)
    opts: dict[str, Any] = {"theme": THEME, "css": CSS, "max_file_size": get_settings().max_image_bytes, "footer_links": ["api"]}
    opts.update(kwargs)
    return demo.launch(**opts)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))


if __name__ == "__main__":
    main()
