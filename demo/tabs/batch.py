"""The Batch tab: a zip of images (and an optional manifest) in, a job id out; the job's progress,
its gallery, its failures and its results zip, polled until it finishes. The job stays bound to
whoever submitted it (token, browser or session: demo/guard.py)."""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from arrcoc.request import Controls
from arrcoc.result import WEAK_MATCH
from arrcoc.service.jobs.archive import MANIFEST_NAMES
from arrcoc.service.jobs.types import JobState
from arrcoc.settings import OVERLAYS, Settings

from .. import batchview, jobs
from ..errors import friendly, user_error
from ..guard import client_address, owner_of
from ..page import PRIVATE, PUSH_JOB_JS
from ..page import caption as _caption
from ..page import mb as _mb


def batch_submit(
    zip_path: str | None,
    manifest_path: str | None,
    query: str,
    token: str | None = None,
    overlay_kind: str | None = None,
    request: gr.Request = None,
) -> tuple[str, str, str, gr.Timer]:
    try:
        owner = owner_of(request, token, "batch")  # the job is bound to this token, browser or session
        job_id = jobs.submit_batch(
            zip_path,
            manifest_path,
            query,
            Controls(),
            owner=owner,
            overlays=overlay_kind,
            address=client_address(request),
        )
    except Exception as e:
        raise user_error(e) from e
    # the status line says it too; the toast goes before the gallery appears under it
    gr.Info(f"Batch job {job_id} submitted.", duration=4)
    return (
        job_id,
        f"batch job `{job_id}` submitted",
        jobs.progress_html(None, "queued"),
        gr.Timer(active=True),
    )


def batch_poll(job_id: str, token: str | None = None, request: gr.Request = None) -> tuple:
    """The page's poll: status, bar, results file, gallery, failures, timer."""
    keep = (gr.skip(), gr.skip())
    if not job_id or (isinstance(job_id, str) and not job_id.strip()):
        return (
            "Submit a batch or paste a job id.",
            jobs.progress_html(None),
            None,
            *keep,
            gr.Timer(active=False),
        )
    try:
        owner = owner_of(request, token, "batch")
        st = jobs.job_status(job_id, owner)
        file = jobs.batch_results_file(st.job_id, owner) if st.state == JobState.DONE else None
    except Exception as e:
        return (f"**Error:** {friendly(e)}", jobs.progress_html(None), None, *keep, gr.Timer(active=False))
    shown = batchview.gallery(file) if file else ("", batchview.failures_markdown([], st))
    return (
        jobs.status_markdown(st),
        jobs.progress_html(st),
        file,
        *shown,
        gr.Timer(active=not st.state.finished),
    )


def batch_cancel(job_id: str, token: str | None = None, request: gr.Request = None) -> str:
    try:
        st = jobs.cancel(job_id, owner_of(request, token, "batch"))
    except Exception as e:
        raise user_error(e) from e
    return jobs.status_markdown(st)


def build_batch_tab(settings: Settings) -> tuple[gr.Textbox, gr.Timer]:
    with gr.Tab("Batch", id="batch"):
        _caption(
            f"Many images, one query (or a manifest with a query per file). Zips up to {_mb(settings.limits.max_archive_bytes)}, "
            f"each photo in them up to {_mb(settings.limits.max_image_bytes)}. Jobs keep running if you close the page. A job is shown only to the "
            "browser that submitted it (or to its API token): its address (with the job id) brings it back in this "
            "browser, not in another one."
        )
        with gr.Row():
            with gr.Column():
                zip_in = gr.File(label="images (.zip)", file_types=[".zip"], elem_id="batch-zip")
                names = " or ".join(MANIFEST_NAMES)
                manifest = gr.File(
                    label=f"manifest (optional: .csv or .jsonl with file,query; or {names} inside the zip)",
                    file_types=[Path(n).suffix for n in MANIFEST_NAMES],
                )
                query = gr.Textbox(
                    label="query for every image", placeholder="e.g. the red one", elem_id="batch-query"
                )
                overlay_kind = gr.Radio(
                    list(OVERLAYS),
                    value="relevance",  # a person is looking: draw the maps (programs ask for none)
                    label="overlays",
                    info="relevance: the map over each photo; foveated: each photo as a "
                    "vision-language model would be given it under its token budgets; none: "
                    "results.parquet and summary.csv only (fastest)",
                    elem_id="batch-overlay",
                )
                token = gr.Textbox(
                    label="API token",
                    type="password",
                    visible=settings.access.token_required("batch"),
                    elem_id="batch-token",
                )
                submit = gr.Button("Submit batch", variant="primary", elem_id="batch-submit")
            with gr.Column():
                with gr.Row():
                    job = gr.Textbox(
                        label="job id",
                        placeholder="paste a job id to see it again",
                        elem_id="batch-job",
                        scale=3,
                    )
                    show = gr.Button("Show job", scale=1)
                    cancel = gr.Button("Cancel", variant="stop", scale=1)
                bar = gr.HTML(jobs.progress_html(None), elem_id="batch-progress")
                status = gr.Markdown("No job yet.", elem_id="batch-status")
                file = gr.File(
                    label="results (.zip: results.parquet, summary.csv and the overlays asked for)",
                    interactive=False,
                    elem_id="batch-results",
                )
        gr.Markdown(
            "**Results**: each overlay (without overlays: each relevance map, from results.parquet) with its "
            "file, query, match score and most relevant cell; failed items "
            f"are listed under it with their reason. A score from {WEAK_MATCH:.2f} up is a possible match, not "
            "a confirmed find (the score is not calibrated on photos); below it, a weak match.",
            elem_classes="arr-caption",
            elem_id="batch-results-caption",
        )
        gallery = gr.HTML(elem_id="batch-gallery")
        failures = gr.Markdown(elem_id="batch-failures")
        timer = gr.Timer(1.0, active=False)

    # the page's own events (api_name page_*): the API's endpoints are demo/tabs/api.py's, in JSON
    submit.click(
        batch_submit,
        [zip_in, manifest, query, token, overlay_kind],
        [job, status, bar, timer],
        api_name="page_batch_submit",
        **PRIVATE,
    ).then(None, job, None, js=PUSH_JOB_JS, **PRIVATE)
    gr.on(
        [show.click, job.submit, timer.tick],
        batch_poll,
        [job, token],
        [status, bar, file, gallery, failures, timer],
        show_progress="hidden",
        **PRIVATE,
    )
    show.click(None, job, None, js=PUSH_JOB_JS, **PRIVATE)
    cancel.click(batch_cancel, [job, token], status, api_name="page_batch_cancel", **PRIVATE)
    return job, timer
