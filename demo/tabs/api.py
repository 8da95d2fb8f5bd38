"""The API's endpoints, for gradio_client and the "Use via API" page: hidden components whose
functions return plain JSON (job ids, states, counts, results) and files, never the page's widgets.
The page's own events are private (demo/tabs/*.py); both call the same jobs functions.

A token, where the server needs one, travels in the X-Arrcoc-Token (or Authorization: Bearer)
header; jobs are bound to it, or else to the caller's session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from arrcoc.images import load_image
from arrcoc.render import overlay
from arrcoc.request import Controls
from arrcoc.service.jobs.types import JobState
from arrcoc.settings import BACKENDS, DEFAULT_OVERLAYS, OVERLAYS, Settings

from .. import batchview, jobs, reports, service
from ..errors import user_error
from ..guard import client_address, owner_of
from ..inputs import photo_input, query_text, read_image

API_OVERLAY_SIDE = (
    2048  # /infer's overlay: the photo's own size, unless a big JPEG reduces to about this while decoding
)


def api_infer(image_path: str | None, query: str) -> tuple[dict[str, Any], Any]:
    return _infer(image_path, query, lambda photo, result: overlay(photo, result.relevance))


def api_infer_foveated(image_path: str | None, query: str) -> tuple[dict[str, Any], Any]:
    """/infer's result and, in place of the overlay, the foveated view at the photo's size (torch is
    imported on the first call, not with the demo)."""
    from arrcoc.foveate import foveated_image

    return _infer(image_path, query, lambda photo, result: foveated_image(photo, result.budget_map))


def _infer(
    image_path: str | None, query: str, picture: Callable[[Any, Any], Any]
) -> tuple[dict[str, Any], Any]:
    """One request's result as JSON and `picture(photo, result)`, errors in the page's words."""
    try:
        data = read_image(image_path)
        result = service.infer(data, query_text(query), Controls())
        return result.to_json(), picture(load_image(data, side=API_OVERLAY_SIDE), result)
    except Exception as e:
        raise user_error(e) from e


def api_batch_submit(
    zip_path: str | None,
    manifest_path: str | None,
    query: str,
    overlays: str = DEFAULT_OVERLAYS,
    request: gr.Request = None,
) -> dict[str, Any]:
    try:
        job_id = jobs.submit_batch(
            zip_path,
            manifest_path,
            query,
            Controls(),
            owner=owner_of(request, None, "batch"),
            overlays=overlays,
            address=client_address(request),
        )
        return jobs.status_doc(jobs.job_status(job_id, owner_of(request, None, "batch")))
    except Exception as e:
        raise user_error(e) from e


def api_batch_status(job_id: str, request: gr.Request = None) -> tuple[dict[str, Any], str | None]:
    try:
        owner = owner_of(request, None, "batch")
        st = jobs.job_status(job_id, owner)
        file = jobs.batch_results_file(st.job_id, owner) if st.state == JobState.DONE else None
    except Exception as e:
        raise user_error(e) from e
    return batchview.status_json(st, file), file


def api_batch_cancel(job_id: str, request: gr.Request = None) -> dict[str, Any]:
    try:
        return jobs.status_doc(jobs.cancel(job_id, owner_of(request, None, "batch")))
    except Exception as e:
        raise user_error(e) from e


def api_bench_submit(
    variant: str,
    backends: list[str],
    buckets: list[str],
    iterations: float,
    device: str,
    request: gr.Request = None,
) -> dict[str, Any]:
    try:
        owner = owner_of(request, None, "bench")
        job_id = jobs.submit_bench(variant, backends, buckets, iterations, device, owner=owner)
        return jobs.status_doc(jobs.job_status(job_id, owner))
    except Exception as e:
        raise user_error(e) from e


def api_bench_status(job_id: str, request: gr.Request = None) -> tuple[dict[str, Any], list[str] | None]:
    try:
        owner = owner_of(request, None, "bench")
        st = jobs.job_status(job_id, owner)
        doc = jobs.status_doc(st)
        if st.state != JobState.DONE:
            return doc, None
        report = service.executor().bench_report(st.job_id, owner=owner)
    except Exception as e:
        raise user_error(e) from e
    doc["env"], doc["results"] = report.get("env") or {}, report.get("results") or []
    return doc, reports.report_files(report, f"bench-{st.job_id}")


def build_api(settings: Settings) -> None:
    """Every API endpoint, on hidden components."""
    with gr.Row(visible=False):
        image, query = photo_input(label="image"), gr.Textbox(label="query")
        doc, picture, button = (
            gr.JSON(label="result"),
            gr.Image(type="pil", format="png", label="overlay"),
            gr.Button(),
        )
        zip_in, manifest = gr.File(label="images (.zip)"), gr.File(label="manifest (.csv/.jsonl), optional")
        batch_query, job = gr.Textbox(label="query for every image"), gr.Textbox(label="job id")
        overlay_kind = gr.Radio(list(OVERLAYS), value=DEFAULT_OVERLAYS, label="overlays")
        status, results, files = (
            gr.JSON(label="status"),
            gr.File(label="results (.zip)"),
            gr.File(file_count="multiple"),
        )
        variant = gr.Textbox(label="variant", value=settings.engine.variant)
        backends = gr.CheckboxGroup(list(BACKENDS), label="backends")
        buckets = gr.CheckboxGroup([str(b) for b in settings.engine.buckets], label="batch buckets")
        iters = gr.Slider(1, settings.jobs.max_bench_iterations, step=1, label="timed iterations")
        device = gr.Radio(["auto", "cpu", "cuda"], value="auto", label="device")
        foveated, fov_button = gr.Image(type="pil", format="png", label="foveated view"), gr.Button()
        buttons = [gr.Button() for _ in range(5)]
    button.click(
        api_infer,
        [image, query],
        [doc, picture],
        api_name="infer",
        api_description="One photo and a query with default controls -> (the result as JSON, the same keys as "
        "`arrcoc infer --json`, including match_score and weak_match; the relevance overlay PNG).",
    )
    fov_button.click(
        api_infer_foveated,
        [image, query],
        [doc, foveated],
        api_name="infer_foveated",
        api_description="One photo and a query with default controls -> (the result as JSON, as /infer "
        "gives it, with selected_boxes: the selected cells in the photo's pixels and their "
        "tokens; the foveated view PNG at the photo's size: what a vision-language model "
        "would be given under the budgets, each selected cell as sharp as its tokens "
        "afford, the rest at a low base resolution; see arrcoc.foveate).",
    )
    buttons[0].click(
        api_batch_submit,
        [zip_in, manifest, batch_query, overlay_kind],
        status,
        api_name="batch_submit",
        api_description="Submit a batch job: (images .zip, optional manifest .csv/.jsonl with file,query, "
        "query for every image, optional overlays: relevance (the map over each photo, the "
        "default) or foveated (each photo under its token budgets)) -> the job's status as "
        "JSON: job_id, state, counts.",
    )
    buttons[1].click(
        api_batch_status,
        job,
        [status, results],
        api_name="batch_status",
        api_description="A batch job's status as JSON (job_id, kind, state, finished, total, done, failed, "
        "progress, message, queue_position, created_at, updated_at; once done, results: the names of the "
        "zip and of what it holds, file, rows (results.parquet: one row per item), summary (summary.csv) "
        "and overlays) and the results .zip once it is ready. Only the Client (or API token) that "
        "submitted the job may read it.",
    )
    buttons[2].click(
        api_batch_cancel,
        job,
        status,
        api_name="batch_cancel",
        api_description="Cancel a batch job by id -> its status as JSON.",
    )
    buttons[3].click(
        api_bench_submit,
        [variant, backends, buckets, iters, device],
        status,
        api_name="bench_submit",
        api_description="Submit a benchmark job: (variant, backends, batch buckets, timed iterations, "
        "device) -> the job's status as JSON: job_id, state.",
    )
    buttons[4].click(
        api_bench_status,
        job,
        [status, files],
        api_name="bench_status",
        api_description="A benchmark job's status as JSON (state, message; when done, env and one result "
        "row per backend and bucket) and the report's files (JSON, CSV).",
    )
