"""The Benchmark tab: a stored report measured like this server (or a plain word that there is
none), a small benchmark job whose default compares something on this machine, and its report
(table, charts, files) when it is done."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

import gradio as gr

from arrcoc.registry import list_variants
from arrcoc.service.jobs.types import JobState
from arrcoc.settings import BACKENDS, Settings, get_settings

from .. import charts, jobs, reports, service
from ..errors import friendly, user_error
from ..guard import owner_of
from ..page import PRIVATE, PUSH_JOB_JS

JOB_PREFIX = "job:"  # a stored-reports choice that names a job's report rather than a file
# the table's columns as the page shows them (the downloads keep the report's own names)
SHORT_COLUMNS = {
    "throughput_per_s": "img/s",
    "speedup_vs_eager": "× eager",
    "max_abs_diff": "max |Δ| vs eager",
    "topk_agreement": "top-K agree",
    "compile_s": "compile s",
    "capture_s": "capture s",
}


@lru_cache(maxsize=1)
def local_gpu() -> str | None:
    """This process's GPU name (None: none). Only asked when benchmarks run here: a page that
    submits to a queue never imports torch."""
    if get_settings().service.broker_url:
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def server_machine(settings: Settings) -> reports.Machine:
    """What this server's benchmarks measure: its variant, on its device ("" when a queue's workers run them)."""
    return reports.Machine(
        settings.engine.variant, "" if settings.service.broker_url else (local_gpu() or "cpu")
    )


def default_job(settings: Settings) -> tuple[list[str], list[str], int]:
    """(backends, buckets, iterations) a first click runs: on a CPU what `arrcoc bench` runs there
    (arrcoc.bench.CPU_DEFAULTS: eager against ONNX Runtime, single images against a small batch,
    in seconds); on a GPU the served backends at two small buckets."""
    if not settings.service.broker_url and local_gpu() is None:
        from arrcoc.bench import CPU_DEFAULTS  # torch is loaded already: local_gpu() asked it

        onnx = importlib.util.find_spec("onnxruntime") is not None
        backends = [b for b in CPU_DEFAULTS.backends if b in BACKENDS and (b != "onnx" or onnx)]
        buckets = [str(b) for b in CPU_DEFAULTS.buckets if b in settings.engine.buckets] or [
            str(settings.engine.buckets[0])
        ]
        return backends, buckets, CPU_DEFAULTS.iters
    backends = list(dict.fromkeys(["eager", *settings.engine.backends]))
    small = [b for b in settings.engine.buckets if b <= 8]
    buckets = [str(b) for b in (small[:1] + small[-1:] if len(small) > 1 else settings.engine.buckets[:2])]
    return backends, list(dict.fromkeys(buckets)), 50


def gpu_note(settings: Settings) -> str:
    if settings.service.broker_url:
        return "Benchmarks run on a GPU worker of the queue (this page does not see its device)."
    if local_gpu():
        return f"GPU: **{local_gpu()}**."
    return (
        "**No GPU on this server**: benchmarks run on the CPU. The `cuda` device is unavailable and "
        "`compiled` runs without CUDA graphs (compiling on CPU takes a while)."
    )


def bench_submit(
    variant: str,
    backends: list[str],
    buckets: list[str],
    iterations: float,
    device: str,
    token: str | None = None,
    request: gr.Request = None,
) -> tuple[str, str, gr.Timer]:
    try:
        if device == "cuda" and not get_settings().service.broker_url and local_gpu() is None:
            raise gr.Error(
                "No GPU is visible on this server: choose the cpu (or auto) device.",
                title="GPU only",
                print_exception=False,
            )
        owner = owner_of(request, token, "bench")  # ARRCOC_ACCESS__TOKEN_SCOPE=bench: token holders only
        job_id = jobs.submit_bench(variant, backends, buckets, iterations, device, owner=owner)
    except gr.Error:
        raise
    except Exception as e:
        raise user_error(e) from e
    return job_id, f"benchmark job `{job_id}` submitted: waiting for the device", gr.Timer(active=True)


def display_frame(report: dict[str, Any] | None):
    return reports.report_frame(report).rename(columns=SHORT_COLUMNS)


def report_outputs(report: dict[str, Any] | None, source: str, empty: str = "") -> tuple:
    """Title, the results column (shown or not), table, three charts, files."""
    df = reports.report_frame(report)
    files = reports.report_files(report, Path(source.split()[-1]).stem or "report") if report else None
    title = reports.report_markdown(report, source) if report or not empty else empty
    return (
        title,
        gr.Column(visible=report is not None),
        display_frame(report),
        *charts.report_figures(df),
        files,
    )


def stored_choices(job_id: str = "") -> list[tuple[str, str]]:
    """The dropdown's choices: a finished job's report first (when there is one), then the stored files."""
    out = [(f"job {job_id} — run on this server just now", JOB_PREFIX + job_id)] if job_id else []
    for name in reports.report_choices():
        report = reports.stored_report(name)
        if report is not None:
            out.append((reports.report_label(name, report), name))
    return out


def bench_poll(job_id: str, token: str | None = None, request: gr.Request = None) -> tuple:
    """The page's poll: status, timer, the stored-reports dropdown, and the report's outputs once done."""
    keep = (gr.skip(),) * 8
    if not job_id or (isinstance(job_id, str) and not job_id.strip()):
        return ("", gr.Timer(active=False), *keep)
    try:
        owner = owner_of(request, token, "bench")
        st = jobs.job_status(job_id, owner)
        if st.state != JobState.DONE:
            return (jobs.status_markdown(st), gr.Timer(active=not st.state.finished), *keep)
        report = service.executor().bench_report(st.job_id, owner=owner)
    except Exception as e:
        return (f"**Error:** {friendly(e)}", gr.Timer(active=False), *keep)
    chosen = gr.Dropdown(choices=stored_choices(st.job_id), value=JOB_PREFIX + st.job_id)
    return (
        jobs.status_markdown(st),
        gr.Timer(active=False),
        chosen,
        *report_outputs(report, f"job {st.job_id}"),
    )


def load_matching_report() -> tuple:
    """On load: the newest stored report measured like this server, or a plain word that none is."""
    settings = get_settings()
    server = server_machine(settings)
    report, name = reports.matching_report(server)
    choices = stored_choices()
    if report is None:
        others = "Pick one in the list above to see it (measured elsewhere), or run" if choices else "Run"
        empty = (
            f"**No stored report matches this server** ({server.words()}). {others} a benchmark "
            "to measure this machine."
        )
        return (gr.Dropdown(choices=choices, value=None), *report_outputs(None, "", empty))
    return (gr.Dropdown(choices=choices, value=name), *report_outputs(report, reports.report_source(name)))


def show_stored_report(name: str | None, token: str | None = None, request: gr.Request = None) -> tuple:
    name = name or ""
    if name.startswith(JOB_PREFIX):
        job_id = name.removeprefix(JOB_PREFIX)
        try:
            report = service.executor().bench_report(job_id, owner=owner_of(request, token, "bench"))
        except Exception as e:
            return report_outputs(None, "", f"**Error:** {friendly(e)}")
        return report_outputs(report, f"job {job_id}")
    report = reports.stored_report(name)
    return report_outputs(report, reports.report_source(name) if report else "")


def build_bench_tab(settings: Settings) -> tuple:
    backends0, buckets0, iters0 = default_job(settings)
    with gr.Tab("Benchmark", id="bench"):
        gr.Markdown(gpu_note(settings), elem_id="gpu-note")
        with gr.Row():
            with gr.Column():
                variant = gr.Dropdown(list_variants(), value=settings.engine.variant, label="variant")
                backends = gr.CheckboxGroup(
                    list(BACKENDS), value=backends0, label="backends", elem_id="bench-backends"
                )
                buckets = gr.CheckboxGroup(
                    [str(b) for b in settings.engine.buckets],
                    value=buckets0,
                    label="batch buckets",
                    elem_id="bench-buckets",
                )
                iters = gr.Slider(
                    1, 300, value=iters0, step=1, label="timed iterations", elem_id="bench-iters"
                )
                cuda_label = "cuda" if settings.service.broker_url or local_gpu() else "cuda (no GPU here)"
                device = gr.Radio(
                    [("auto", "auto"), ("cpu", "cpu"), (cuda_label, "cuda")], value="auto", label="device"
                )
                token = gr.Textbox(
                    label="API token",
                    type="password",
                    visible=settings.access.token_required("bench"),
                    elem_id="bench-token",
                )
                submit = gr.Button("Run benchmark", variant="primary", elem_id="bench-submit")
            with gr.Column():
                job = gr.Textbox(
                    label="benchmark job id",
                    placeholder="paste a benchmark job id to see it again",
                    elem_id="bench-job",
                )
                status = gr.Markdown("No benchmark job yet.", elem_id="bench-status")
                # in view on load, beside the job's controls: which report the charts below show
                stored = gr.Dropdown(
                    [],
                    label="report shown below: this machine's (bench-out/), stored (benchmarks/), or this page's job",
                    elem_id="bench-stored",
                )
                title = gr.Markdown(elem_id="bench-report-title")
        with gr.Column(visible=False) as results:
            table = gr.DataFrame(label="results", interactive=False, elem_id="bench-table", wrap=True)
            lat = gr.Plot(show_label=False, label="p50 latency by bucket", elem_id="bench-latency")
            with gr.Row():
                speed = gr.Plot(show_label=False, label="speedup vs eager", elem_id="bench-speedup")
                parity = gr.Plot(show_label=False, label="parity vs eager", elem_id="bench-parity")
            files = gr.File(label="download the report (JSON, CSV)", file_count="multiple", interactive=False)
        timer = gr.Timer(2.0, active=False)

    out = [title, results, table, lat, speed, parity, files]
    submit.click(
        bench_submit,
        [variant, backends, buckets, iters, device, token],
        [job, status, timer],
        api_name="page_bench_submit",
        **PRIVATE,
    ).then(None, job, None, js=PUSH_JOB_JS, **PRIVATE)
    gr.on(
        [timer.tick, job.submit],
        bench_poll,
        [job, token],
        [status, timer, stored, *out],
        show_progress="hidden",
        **PRIVATE,
    )
    stored.input(show_stored_report, [stored, token], out, **PRIVATE)
    return job, timer, stored, out
