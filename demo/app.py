"""ARR-COC Serve demo: Gradio 6 Blocks. Constants, typed handlers, one wiring block, main().

    python -m demo.app            # or: arrcoc demo --port 7860
Nothing heavy happens at import: the executor (and with it the model) is built on the first run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from arrcoc.errors import ArrcocError, InvalidInputError
from arrcoc.images import load_image
from arrcoc.registry import list_variants
from arrcoc.render import overlay
from arrcoc.request import Controls
from arrcoc.service.jobs.types import JobKind, JobState
from arrcoc.settings import BACKENDS, get_settings

from . import jobs, service, views
from .views import Run

log = logging.getLogger("arrcoc.demo")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = ROOT / "arrcoc" / "examples"
EXAMPLES = [  # (photo, query) pairs that fit the photos
    ("coffee.jpg", "the coffee cup"),
    ("chelsea.jpg", "the cat's eyes"),
    ("astronaut.jpg", "the astronaut's face"),
    ("rocket.jpg", "the rocket on the launch pad"),
    ("astronaut.jpg", "the American flag"),
]
MAX_FILE_SIZE = "25mb"  # uploads above this are refused by Gradio before they reach us
GRID_CELLS = 32 * 32
BACKEND_LABELS = {
    "eager": "eager (PyTorch)",
    "compiled": "compiled (torch.compile + CUDA graphs)",
    "onnx": "onnx (ONNX Runtime)",
}
BACKEND_COLOURS = {"eager": "#4c78a8", "compiled": "#54a24b", "onnx": "#f58518"}
TITLE = "ARR-COC Serve — query-aware visual relevance"
INTRO = """
# ARR-COC Serve
Give a photo and a question: the model scores every 16×16-pixel cell of the image three ways —
**information** (how much is there), **perspectival** salience (what stands out) and
**participatory** coupling with your query — balances them into one relevance map, keeps the K most
relevant cells and gives each 64–400 vision tokens. Every view below is drawn from one run.
"""
CSS = """
.arr-legend {display:flex; align-items:center; gap:8px; font-size:0.85em; margin:2px 4px;}
.arr-legend-title {font-weight:600; margin-right:4px;}
.arr-legend-bar {flex:1; height:12px; border-radius:3px; min-width:120px;}
.arr-progress {position:relative; height:22px; background:var(--block-background-fill);
  border:1px solid var(--border-color-primary); border-radius:6px; overflow:hidden;}
.arr-progress-fill {height:100%; background:linear-gradient(90deg,#6366f1,#f59e0b); transition:width .4s;}
.arr-progress span {position:absolute; inset:0; text-align:center; font-size:0.85em; line-height:22px;}
.arr-caption {color: var(--body-text-color-subdued); font-size: 0.9em;}
.arr-texture .fixed-height {min-height: 0 !important; max-height: none !important;}
.arr-texture .grid-wrap {overflow-y: visible !important;}
footer {visibility: hidden;}
"""
CHANNEL_GROUP_LABELS = ("colour: R, G, B, L*, a*, b*", "edges: Sobel x, y, magnitude, contrast", "position: y, x, eccentricity")
THEME = gr.themes.Soft(primary_hue="indigo", secondary_hue="amber")


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
        raise InvalidInputError("Upload a photo first (or click one of the examples below).")
    return Path(path).read_bytes()


def _user_error(e: Exception) -> gr.Error:
    if isinstance(e, ArrcocError):
        return gr.Error(str(e), title="Cannot run that")
    log.exception("demo handler failed")
    return gr.Error("Something went wrong on the server. Try again; details are in the server log.")


def run_model(
    image_path: str | None, query: str, s_info: float, s_persp: float, s_part: float, k: float,
    budget: float, backend: str, scale: str = "sqrt", progress: gr.Progress = gr.Progress(),
) -> tuple[Run, Any, Any, Any, str, str]:  # fmt: skip
    """Run the model once; store the run; return the overview (the rest is drawn by render_views)."""
    try:
        progress(0.05, desc="Reading the photo")
        data = _read_image(image_path)
        if not (query or "").strip():
            raise InvalidInputError("Type a query: what should the model look for? e.g. 'the red mug'.")
        controls = Controls(float(s_info), float(s_persp), float(s_part), int(k), int(budget))
        image = views.display_image(load_image(data))
        progress(0.25, desc="Running the model (the first run also loads it)")
        result = service.infer(data, query, controls, backend)
    except Exception as e:
        raise _user_error(e) from e
    run = Run(image=image, result=result, scale=scale or "sqrt")
    return (run, *views.overview(run), "Drawing the other views…")


def run_without_query(run: Run | None, image_path: str | None, s_info: float, s_persp: float, backend: str) -> Run | None:
    """The same photo with the participatory scorer off (query impact); one more model call."""
    if run is None:
        return None
    r = run.result
    if abs(float(r.balance[2])) < 1e-9:  # the participatory scorer was off already
        return replace(run, without_query=r)
    try:
        c = Controls(float(s_info), float(s_persp), 0.0, r.k, r.token_budget)  # the user's other scales
        without = service.infer(_read_image(image_path), r.query, c, backend)
    except Exception as e:  # the main views are already shown; say why this one is missing
        gr.Warning(f"Query impact unavailable: {e}")
        return run
    return replace(run, without_query=without)


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
    ready = f"All views are drawn for “{run.result.query}”: pick one in the tabs above."
    return (*views.impact_view(run), ready)


def api_infer(image_path: str | None, query: str) -> tuple[dict[str, Any], Any]:
    """POST /infer: (image file, query) -> (result JSON as `arrcoc infer --json`, overlay image)."""
    try:
        data = _read_image(image_path)
        result = service.infer(data, query, Controls())
        return result.to_json(), overlay(load_image(data), result.relevance)
    except Exception as e:
        raise _user_error(e) from e


# ---- handlers: batch -----------------------------------------------------------------------------


def batch_submit(zip_path: str | None, manifest_path: str | None, query: str) -> tuple[str, str, str, gr.Timer]:
    try:
        job_id = jobs.submit_batch(zip_path, manifest_path, query, Controls())
    except Exception as e:
        raise gr.Error(jobs.friendly(e)) from e
    gr.Info(f"Batch job {job_id} submitted.")
    return job_id, f"batch job `{job_id}` submitted", jobs.progress_html(None), gr.Timer(active=True)


def batch_poll(job_id: str) -> tuple[str, str, str | None, gr.Timer]:
    if not (job_id or "").strip():
        return "Submit a batch or paste a job id.", jobs.progress_html(None), None, gr.Timer(active=False)
    try:
        st = jobs.job_status(job_id)
        file = jobs.batch_results_file(st.job_id) if st.state == JobState.DONE else None
    except Exception as e:
        return f"**Error:** {jobs.friendly(e)}", jobs.progress_html(None), None, gr.Timer(active=False)
    return jobs.status_markdown(st), jobs.progress_html(st), file, gr.Timer(active=not st.state.finished)


def batch_cancel(job_id: str) -> str:
    try:
        st = service.executor().cancel(job_id.strip())
    except Exception as e:
        raise gr.Error(jobs.friendly(e)) from e
    return jobs.status_markdown(st)


def on_load(request: gr.Request) -> tuple[str, gr.Timer, str, gr.Timer, Any]:
    """?job=ID in the URL shows that job again (batch or benchmark) after a refresh."""
    job_id = (request.query_params.get("job") or "").strip() if request else ""
    if not job_id:
        return "", gr.Timer(active=False), "", gr.Timer(active=False), gr.Tabs()
    try:
        kind = jobs.job_status(job_id).kind
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


def bench_submit(variant: str, backends: list[str], buckets: list[str], iterations: float, device: str) -> tuple[str, str, gr.Timer]:
    if device == "cuda" and not torch.cuda.is_available() and not get_settings().broker_url:
        raise gr.Error("No GPU is visible on this server: choose the cpu (or auto) device.", title="GPU only")
    try:
        job_id = jobs.submit_bench(variant, backends, buckets, int(iterations), device)
    except Exception as e:
        raise gr.Error(jobs.friendly(e)) from e
    return job_id, f"benchmark job `{job_id}` submitted", gr.Timer(active=True)


def _report_outputs(report: dict[str, Any] | None, source: str) -> tuple:
    df = jobs.report_frame(report)
    latency, speedup, parity = jobs.plot_frames(df)
    files = jobs.report_files(report, Path(source.split()[-1]).stem or "report") if report else None
    bars = {"x_label_angle": -35}
    return (
        jobs.report_markdown(report, source), gr.Column(visible=report is not None), df, latency,
        gr.BarPlot(speedup, sort=list(speedup["bucket"]), **bars), gr.BarPlot(parity, sort=list(parity["bucket"]), **bars), files,
    )  # fmt: skip


def bench_poll(job_id: str) -> tuple:
    keep = (gr.skip(),) * 7
    if not (job_id or "").strip():
        return ("", gr.Timer(active=False), *keep)
    try:
        st = jobs.job_status(job_id)
        if st.state != JobState.DONE:
            return (jobs.status_markdown(st), gr.Timer(active=not st.state.finished), *keep)
        report = service.executor().bench_report(st.job_id)
    except Exception as e:
        return (f"**Error:** {jobs.friendly(e)}", gr.Timer(active=False), *keep)
    return (jobs.status_markdown(st), gr.Timer(active=False), *_report_outputs(report, f"job {st.job_id}"))


def load_last_report() -> tuple:
    names = jobs.stored_reports()
    return (gr.Dropdown(choices=names, value=names[0] if names else None), *show_stored_report(names[0] if names else ""))


def show_stored_report(name: str) -> tuple:
    report = jobs.stored_report(name)
    return _report_outputs(report, f"Stored report: benchmarks/{name}" if report else "")


# ---- the page ----------------------------------------------------------------------------------------

PUSH_JOB_JS = "(id) => { const u = new URL(window.location); if (id) { u.searchParams.set('job', id); window.history.replaceState(null, '', u); } }"


def _caption(text: str) -> gr.Markdown:
    return gr.Markdown(text, elem_classes="arr-caption")


def build_demo() -> gr.Blocks:
    settings = get_settings()
    with gr.Blocks(title=TITLE) as demo:
        state = gr.State(None)
        gr.Markdown(INTRO)
        with gr.Tabs(elem_id="main-tabs") as tabs:
            with gr.Tab("Inference", id="infer"):
                query_in = gr.Textbox(label="Query", placeholder="what should the model look for? e.g. the red mug",
                                      max_length=settings.max_query_chars, elem_id="query", render=False)  # fmt: skip
                with gr.Row(equal_height=False):
                    with gr.Column(scale=5):
                        image_in = photo_input(label="Photo", sources=["upload", "clipboard"], height=360, elem_id="photo")
                        gr.Examples([[str(EXAMPLES_DIR / f), q] for f, q in EXAMPLES], [image_in, query_in],
                                    label="Examples: public-domain photos from scikit-image", examples_per_page=5)  # fmt: skip
                    with gr.Column(scale=4):
                        query_in.render()
                        run_btn = gr.Button("Run", variant="primary", elem_id="run")
                        with gr.Accordion("Controls", open=True):
                            with gr.Row():
                                s_info = gr.Slider(0, 3, value=1.0, step=0.05, label="information scale")
                                s_persp = gr.Slider(0, 3, value=1.0, step=0.05, label="perspectival scale")
                                s_part = gr.Slider(0, 3, value=1.0, step=0.05, label="participatory scale")
                            with gr.Row():
                                k_in = gr.Slider(1, GRID_CELLS, value=200, step=1, label="K (cells kept)")
                                budget_in = gr.Slider(1024, 102400, value=25600, step=256, label="token budget", info="≥ 64 × K")
                            backend_in = gr.Dropdown([(BACKEND_LABELS[b], b) for b in BACKENDS], value=service.served_backend(), label="backend",
                                                     info="the engine that runs the model; the Benchmark tab compares them")
                with gr.Tabs(elem_id="views"):
                    with gr.Tab("Overview", id="overview"):
                        with gr.Row():
                            ov_photo = gr.Image(label="photo", interactive=False, buttons=["fullscreen"])
                            ov_heat = gr.Image(label="relevance", interactive=False, format="png", elem_id="relevance-map", buttons=["download", "fullscreen"])
                            ov_sel = gr.Image(label="selected cells", interactive=False, buttons=["fullscreen"])
                        with gr.Row(equal_height=True):
                            gr.HTML(views.colourbar_html("low", "high (the map's peak)", "relevance"))
                            scale_in = gr.Radio([(k, v) for k, v in views.SCALES.items()], value="sqrt", label="colour scale (every map)",
                                                elem_id="scale")  # fmt: skip
                        ov_md = gr.Markdown("Upload a photo, type a query and press **Run** — or click an example.", elem_id="summary")
                        views_status = gr.Markdown(elem_id="views-status", elem_classes="arr-caption")
                    with gr.Tab("Homunculus", id="homunculus"):
                        _caption("What the model keeps: rejected cells are dimmed.")
                        hom_img = gr.Image(label="homunculus", interactive=False, height=480)
                        hom_md = gr.Markdown()
                    with gr.Tab("Three ways", id="three"):
                        _caption("The three scorers (ways of knowing) and their balanced mix.")
                        with gr.Row():
                            tw = [gr.Image(label=n, interactive=False, format="png") for n in ("information", "perspectival", "participatory (query)", "balanced relevance")]
                        gr.HTML(views.colourbar_html("low", "high (each map's peak)", "score"))
                        tw_md = gr.Markdown()
                    with gr.Tab("Overlays", id="overlays"):
                        with gr.Row():
                            map_in = gr.Radio(list(views.MAPS), value="relevance (balanced)", label="map")
                            opacity_in = gr.Slider(0, 1, value=0.55, step=0.05, label="opacity")
                        ovl_img = gr.Image(label="overlay", interactive=False, height=480, elem_id="overlay")
                        gr.HTML(views.colourbar_html("low", "high (the map's peak; token budget: 400)", "map value"))
                    with gr.Tab("Texture", id="texture"):
                        _caption("The 13 per-cell features the scorers read, each scaled to its own range (shown in brackets).")
                        gallery = dict(height="auto", object_fit="contain", allow_preview=True, elem_classes="arr-texture")
                        tex = [gr.Gallery(label=CHANNEL_GROUP_LABELS[0], columns=6, **gallery)]
                        with gr.Row():
                            tex.append(gr.Gallery(label=CHANNEL_GROUP_LABELS[1], columns=4, scale=4, **gallery))
                            tex.append(gr.Gallery(label=CHANNEL_GROUP_LABELS[2], columns=3, scale=3, **gallery))
                    with gr.Tab("LOD budget", id="budget"):
                        _caption("Level of detail: vision tokens per cell (64–400 for kept cells).")
                        with gr.Row():
                            with gr.Column():
                                bud_img = gr.Image(label="tokens per cell", interactive=False, format="png")
                                gr.HTML(views.colourbar_html("0", "400 tokens", "budget"))
                            bud_plot = gr.LinePlot(x="rank", y="tokens", title="tokens by relevance rank", x_title="rank of kept cell", y_title="tokens", height=320)
                        bud_md = gr.Markdown()
                    with gr.Tab("vs uniform", id="compare"):
                        _caption("ARR-COC's K cells against a query-blind uniform lattice of the same K.")
                        with gr.Row():
                            cmp_ours = gr.Image(label="ARR-COC", interactive=False)
                            cmp_base = gr.Image(label="uniform grid", interactive=False)
                        cmp_md = gr.Markdown()
                        cmp_df = gr.DataFrame(label="selection metrics", interactive=False)
                    with gr.Tab("Metrics", id="metrics"):
                        _caption(f"How the kept cells spread over the image (regions: a {4}×{4} split of the grid).")
                        with gr.Row():
                            met_df = gr.DataFrame(label="metrics", interactive=False, elem_id="metrics-table", scale=3)
                            met_img = gr.Image(label="kept cells per region (brighter: more)", interactive=False, scale=2)
                    with gr.Tab("Query impact", id="impact"):
                        _caption("With the query vs without the participatory scorer (its scale set to 0): one extra model call.")
                        with gr.Row():
                            imp_with = gr.Image(label="relevance with the query", interactive=False)
                            imp_without = gr.Image(label="without the participatory scorer", interactive=False)
                            imp_change = gr.Image(label="selection change", interactive=False)
                        imp_md = gr.Markdown(elem_id="impact-summary")
                    with gr.Tab("Attribution", id="attribution"):
                        att_plot = gr.BarPlot(x="channel", y="correlation", color="group", title="correlation with relevance", y_lim=[-1, 1], x_label_angle=-40, height=360, sort=None)
                        att_md = gr.Markdown()

            with gr.Tab("Batch", id="batch"):
                _caption("Many images, one query (or a manifest with a query per file). Jobs keep running if you close the page: "
                         "keep the job id (it is also in the address bar) to come back to it.")  # fmt: skip
                with gr.Row():
                    with gr.Column():
                        b_zip = gr.File(label="images (.zip)", file_types=[".zip"], elem_id="batch-zip")
                        b_manifest = gr.File(label="manifest (optional: .csv or .jsonl with file,query)", file_types=[".csv", ".jsonl"])
                        b_query = gr.Textbox(label="query for every image", placeholder="e.g. the face", elem_id="batch-query")
                        b_submit = gr.Button("Submit batch", variant="primary", elem_id="batch-submit")
                    with gr.Column():
                        with gr.Row():
                            b_job = gr.Textbox(label="job id", placeholder="paste a job id to see it again", elem_id="batch-job", scale=3)
                            b_show = gr.Button("Show job", scale=1)
                            b_cancel = gr.Button("Cancel", variant="stop", scale=1)
                        b_bar = gr.HTML(jobs.progress_html(None), elem_id="batch-progress")
                        b_status = gr.Markdown("No job yet.", elem_id="batch-status")
                        b_file = gr.File(label="results (.zip: overlay PNGs, results.jsonl, summary.csv)", interactive=False, elem_id="batch-results")
                b_timer = gr.Timer(1.0, active=False)

            with gr.Tab("Benchmark", id="bench"):
                gr.Markdown(gpu_note(), elem_id="gpu-note")
                with gr.Row():
                    with gr.Column():
                        bn_variant = gr.Dropdown(list_variants(), value=settings.variant, label="variant")
                        bn_backends = gr.CheckboxGroup(list(BACKENDS), value=["eager"], label="backends")
                        bn_buckets = gr.CheckboxGroup([str(b) for b in settings.buckets], value=["1"], label="batch buckets")
                        bn_iters = gr.Slider(1, 300, value=20, step=1, label="timed iterations")
                        cuda_label = "cuda" if torch.cuda.is_available() or settings.broker_url else "cuda (no GPU here)"
                        bn_device = gr.Radio([("auto", "auto"), ("cpu", "cpu"), (cuda_label, "cuda")], value="auto", label="device")
                        bn_submit = gr.Button("Run benchmark", variant="primary")
                    with gr.Column():
                        bn_job = gr.Textbox(label="benchmark job id", placeholder="paste a benchmark job id to see it again")
                        bn_status = gr.Markdown("No benchmark job yet.", elem_id="bench-status")
                with gr.Row():
                    bn_title = gr.Markdown(elem_id="bench-report-title")
                    bn_stored = gr.Dropdown([], label="stored reports (benchmarks/*.json, newest first)", scale=0, min_width=360)
                with gr.Column(visible=False) as bn_results:
                    bn_df = gr.DataFrame(label="results", interactive=False, elem_id="bench-table")
                    with gr.Row():
                        bn_lat = gr.LinePlot(x="bucket", y="value", color="series", title="p50 latency by bucket", x_title="batch bucket", y_title="ms", color_map=BACKEND_COLOURS, height=320)
                        bn_speed = gr.BarPlot(x="bucket", y="value", color="series", title="speedup vs eager (p50)", x_title="bucket · backend", y_title="×", color_map=BACKEND_COLOURS, height=320, sort=None)
                        bn_parity = gr.BarPlot(x="bucket", y="value", color="series", title="parity: max |Δ| vs eager", x_title="bucket · backend", y_title="max abs diff", color_map=BACKEND_COLOURS, height=320, sort=None)
                    bn_files = gr.File(label="download the report (JSON, CSV)", file_count="multiple", interactive=False)
                bn_timer = gr.Timer(2.0, active=False)

        with gr.Row(visible=False):  # the /infer API endpoint's own components
            api_image = photo_input(label="image")
            api_query = gr.Textbox()
            api_json = gr.JSON(label="result")
            api_overlay = gr.Image(type="pil", format="png", label="overlay")
            api_btn = gr.Button()

        # ---- wiring --------------------------------------------------------------------------
        private: dict[str, Any] = {"api_visibility": "private"}
        view_outputs = [hom_img, hom_md, *tw, tw_md, ovl_img, *tex, bud_img, bud_md, bud_plot,
                        cmp_ours, cmp_base, cmp_df, cmp_md, met_df, met_img, att_plot, att_md]  # fmt: skip
        ran = run_btn.click(
            run_model,
            [image_in, query_in, s_info, s_persp, s_part, k_in, budget_in, backend_in, scale_in],
            [state, ov_photo, ov_heat, ov_sel, ov_md, views_status],
            api_name="run", concurrency_limit=2,
        )  # fmt: skip
        query_in.submit(lambda: None, None, None, js="() => document.querySelector('#run').click()", **private)
        ran.success(render_views, [state, map_in, opacity_in], view_outputs, **private).then(
            run_without_query, [state, image_in, s_info, s_persp, backend_in], state, **private
        ).then(render_impact, state, [imp_with, imp_without, imp_change, imp_md, views_status], **private)
        scale_in.change(set_scale, [state, scale_in], [state, ov_heat, imp_with, imp_without], show_progress="hidden", **private).then(
            render_views, [state, map_in, opacity_in], view_outputs, show_progress="hidden", **private
        )
        gr.on([map_in.change, opacity_in.change], views.overlay_view, [state, map_in, opacity_in], ovl_img,
              show_progress="hidden", **private)  # fmt: skip
        api_btn.click(api_infer, [api_image, api_query], [api_json, api_overlay], api_name="infer")

        b_submit.click(batch_submit, [b_zip, b_manifest, b_query], [b_job, b_status, b_bar, b_timer], api_name="batch_submit").then(
            None, b_job, None, js=PUSH_JOB_JS, **private
        )
        gr.on([b_show.click, b_job.submit, b_timer.tick], batch_poll, b_job, [b_status, b_bar, b_file, b_timer],
              api_name="batch_status", show_progress="hidden")  # fmt: skip
        b_show.click(None, b_job, None, js=PUSH_JOB_JS, **private)
        b_cancel.click(batch_cancel, b_job, b_status, api_name="batch_cancel")

        bench_out = [bn_title, bn_results, bn_df, bn_lat, bn_speed, bn_parity, bn_files]
        bn_submit.click(bench_submit, [bn_variant, bn_backends, bn_buckets, bn_iters, bn_device], [bn_job, bn_status, bn_timer],
                        api_name="bench_submit").then(None, bn_job, None, js=PUSH_JOB_JS, **private)  # fmt: skip
        gr.on([bn_timer.tick, bn_job.submit], bench_poll, bn_job, [bn_status, bn_timer, *bench_out],
              api_name="bench_status", show_progress="hidden")  # fmt: skip
        demo.load(load_last_report, None, [bn_stored, *bench_out], **private)
        bn_stored.input(show_stored_report, bn_stored, bench_out, **private)
        demo.load(on_load, None, [b_job, b_timer, bn_job, bn_timer, tabs], **private)
    return demo


def launch(demo: gr.Blocks | None = None, **kwargs: Any) -> tuple:
    """Launch with the product's theme, CSS and limits (Gradio 6 takes them in launch())."""
    demo = demo or build_demo()
    demo.queue(default_concurrency_limit=2)
    opts: dict[str, Any] = {"theme": THEME, "css": CSS, "max_file_size": MAX_FILE_SIZE, "footer_links": ["api"]}
    opts.update(kwargs)
    return demo.launch(**opts)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))


if __name__ == "__main__":
    main()
