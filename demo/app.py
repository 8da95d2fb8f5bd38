"""ARR-COC Serve demo: Gradio 6 Blocks, assembled from one module per tab (demo/tabs/).

    python -m demo.app            # or: arrcoc demo --port 7860
Nothing heavy happens at import: the executor (and with it the model) is built on the first run.
Every number the page shows about the model (grid, K, token budget) comes from the serving
variant's config; every limit from the settings. Rate limits apply at the HTTP door
(demo/gate.py's RateGate), before Gradio queues or checks a call, whatever its route.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from arrcoc.service.jobs.types import JobKind
from arrcoc.settings import get_settings

from . import gate, guard, jobs, service
from .housekeeping import start_housekeeping
from .inputs import strict_inputs
from .page import CSS, PRIVATE, THEME, TITLE
from .tabs.about import intro_markdown, model_note, serving_variant
from .tabs.api import build_api
from .tabs.batch import build_batch_tab
from .tabs.bench import build_bench_tab, load_matching_report
from .tabs.infer import build_inference_tab, wire_inference


def on_load(request: gr.Request) -> tuple[str, gr.Timer, str, gr.Timer, Any]:
    """?job=ID in the URL shows that job again (batch or benchmark) after a refresh."""
    job_id = (request.query_params.get("job") or "").strip() if request else ""
    if not job_id:
        return "", gr.Timer(active=False), "", gr.Timer(active=False), gr.Tabs()
    try:
        kind = jobs.job_status(job_id, guard.owner_of(request, None, "batch")).kind
    except Exception:
        kind = JobKind.BATCH
    if kind == JobKind.BENCH:
        return "", gr.Timer(active=False), job_id, gr.Timer(active=True), gr.Tabs(selected="bench")
    return job_id, gr.Timer(active=True), "", gr.Timer(active=False), gr.Tabs(selected="batch")


def build_demo() -> gr.Blocks:
    settings = get_settings()
    variant = serving_variant(settings)
    # Gradio's cache (uploads, served results) is swept on the reaper's schedule
    with gr.Blocks(
        title=TITLE, delete_cache=(settings.jobs.reap_interval_s, settings.jobs.temp_max_age_s)
    ) as demo:
        gr.Markdown(intro_markdown(settings, variant))
        notice = gr.Markdown(elem_id="worker-problems")  # filled on load when a worker cannot serve
        with gr.Accordion("About the model: what it can and cannot find", open=False, elem_id="model-note"):
            gr.Markdown(model_note(variant))
        with gr.Tabs(elem_id="main-tabs") as tabs:
            inputs, shown = build_inference_tab(settings, variant)
            b_job, b_timer = build_batch_tab(settings)
            bn_job, bn_timer, bn_stored, bench_out = build_bench_tab(settings)
        build_api(settings)
        wire_inference(inputs, shown)
        demo.load(load_matching_report, None, [bn_stored, *bench_out], **PRIVATE)
        demo.load(None, None, None, js=guard.SET_CLIENT_COOKIE_JS, **PRIVATE)  # this browser's id: its jobs
        demo.load(on_load, None, [b_job, b_timer, bn_job, bn_timer, tabs], **PRIVATE)
        demo.load(service.worker_notice, None, notice, **PRIVATE)
    strict_inputs(demo)  # API values of the wrong type: a clear error, never converted
    return demo


def launch(demo: gr.Blocks | None = None, **kwargs: Any) -> tuple:
    """Launch with the product's theme, CSS, limits and rate gate (Gradio 6 takes them in launch())."""
    demo = demo or build_demo()
    # uvicorn rewrites the client's address from X-Forwarded-For for the peers it trusts: the same
    # proxies as ours (its default would be loopback, whatever ARRCOC_ACCESS__TRUSTED_PROXIES says)
    os.environ["FORWARDED_ALLOW_IPS"] = guard.uvicorn_proxies(get_settings().access.trusted_proxies)
    start_housekeeping()  # expired jobs' files and old temp files, on a schedule
    # api_open=False: the direct routes (/run/, /api/) refuse queued functions, so every call of
    # one waits its turn under the queue's concurrency limits
    demo.queue(default_concurrency_limit=2, api_open=False)
    app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
    app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), Middleware(gate.RateGate, blocks=demo)]
    opts: dict[str, Any] = {
        "theme": THEME,
        "css": CSS,
        "max_file_size": gate.max_upload_bytes(),  # a batch zip; a photo is held to the image limit
        "footer_links": ["api"],
        "app_kwargs": app_kwargs,
    }
    opts.update(kwargs)
    return demo.launch(**opts)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
    )


if __name__ == "__main__":
    main()
