"""Batch and benchmark jobs from the page and the API: build and submit them through the executor,
read their status, and serve their results. Access (token, owner, limits) is demo/guard.py's."""

from __future__ import annotations

import io
import os
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any

from arrcoc.errors import InvalidInputError
from arrcoc.request import Controls
from arrcoc.service.jobs import archive as archive_checks
from arrcoc.service.jobs.budget import payer
from arrcoc.service.jobs.types import BenchRequest, JobKind, JobState, JobStatus
from arrcoc.settings import get_settings

from . import service
from .housekeeping import served
from .inputs import text_field, upload, whole

MANIFEST_SUFFIXES = (".csv", ".jsonl")
STATE_COLOUR = {
    JobState.PENDING: "#a3a3a3",
    JobState.RUNNING: "#6366f1",
    JobState.DONE: "#16a34a",
    JobState.FAILED: "#dc2626",
    JobState.CANCELLED: "#f59e0b",
    JobState.EXPIRED: "#737373",
}


# ---- batch ------------------------------------------------------------------------------------


def build_archive(zip_path: str | None, manifest_path: str | None) -> bytes:
    """The uploaded zip, with an uploaded manifest (CSV or JSONL: file,query) added to it.

    Nothing is decompressed here: the zip is inspected from its central directory first (the same
    checks the job runs), and the manifest is appended as one more entry (zip append mode rewrites
    only the directory), so a zip bomb costs its compressed size and no more."""
    zp, mp = upload(zip_path, "The zip"), upload(manifest_path, "The manifest")
    if zp is None:
        raise InvalidInputError("Upload a .zip of images first.")
    data = zp.read_bytes()
    settings = get_settings()
    with archive_checks.open_archive(data, settings) as zf:
        names = archive_checks.inspect(zf, settings)
        if not names:
            raise InvalidInputError("The zip is empty: put some images in it.")
    if mp is None:
        return data
    suffix = mp.suffix.lower()
    if suffix not in MANIFEST_SUFFIXES:
        raise InvalidInputError("The manifest must be a .csv or .jsonl file with columns file,query.")
    if mp.stat().st_size > settings.limits.max_manifest_bytes:
        raise InvalidInputError(
            f"The manifest is over {settings.limits.max_manifest_bytes / 1e6:.0f} MB; split the job."
        )
    inside = [n for n in names if Path(n).name.lower() in archive_checks.MANIFEST_NAMES]
    if inside:
        raise InvalidInputError(
            f"The zip already holds a manifest ({inside[0]}); upload the zip alone, or remove"
            " it from the zip to use the one uploaded here."
        )
    raw = mp.read_bytes()
    archive_checks.decode_manifest(raw, mp.name)  # not UTF-8: said now, in words
    out = io.BytesIO(data)
    with zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED) as dst:
        dst.writestr(f"manifest{suffix}", raw)
    return out.getvalue()


def submit_batch(
    zip_path: str | None,
    manifest_path: str | None,
    query: object,
    controls: Controls,
    owner: str | None = None,
    overlays: str | None = None,
    address: str | None = None,
) -> str:
    """The job, its disk reservation counted against the submitter's address (an anonymous
    browser or session is made anew for free) or token (arrcoc.service.jobs.budget.payer)."""
    q = text_field(query, "The query").strip() or None
    archive = build_archive(zip_path, manifest_path)
    if q is None and not manifest_path and not _zip_has_manifest(archive):
        raise InvalidInputError("Type a query for every image, or add a manifest (file,query) to the zip.")
    paid_by = payer(owner, address)
    return service.executor().submit_batch(
        archive, q, controls, owner=owner, overlays=overlays, paid_by=paid_by
    )


def _zip_has_manifest(archive: bytes) -> bool:
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        return any(Path(n).name in archive_checks.MANIFEST_NAMES for n in zf.namelist())


def job_status(job_id: object, owner: str | None = None) -> JobStatus:
    job_id = text_field(job_id, "The job id").strip()
    if not job_id:
        raise InvalidInputError("Paste a job id first.")
    return service.executor().status(job_id, owner=owner)


def cancel(job_id: object, owner: str | None = None) -> JobStatus:
    return service.executor().cancel(text_field(job_id, "The job id").strip(), owner=owner)


def status_markdown(st: JobStatus) -> str:
    dot = f"<span style='color:{STATE_COLOUR.get(st.state, '#888')}'>●</span>"
    lines = [f"{dot} **{st.state.value}** — {st.kind.value} job `{st.job_id}`"]
    if st.total and st.kind == JobKind.BATCH:  # a benchmark is one item: its note says how far it is
        lines.append(f"{st.done} of {st.total} done" + (f", {st.failed} failed" if st.failed else ""))
    if st.state == JobState.PENDING and st.queue_position is not None:
        lines.append(f"queue position: {st.queue_position} job(s) ahead")
    if st.state.finished and st.updated_at and st.created_at:
        lines.append(f"took {max(st.updated_at - st.created_at, 0):.1f} s")
    elif st.created_at:
        lines.append(f"submitted {max(time.time() - st.created_at, 0):.0f} s ago")
    if st.message:
        lines.append(st.message)
    return "  \n".join(lines)


def status_doc(st: JobStatus) -> dict[str, Any]:
    """A job's status as plain JSON for the API (any kind of job)."""
    return {
        "job_id": st.job_id,
        "kind": st.kind.value,
        "state": st.state.value,
        "finished": st.state.finished,
        "total": st.total,
        "done": st.done,
        "failed": st.failed,
        "progress": round(st.progress, 4),
        "message": st.message,
        "queue_position": st.queue_position,
        "created_at": st.created_at,
        "updated_at": st.updated_at,
    }


def progress_html(st: JobStatus | None, doing: str = "") -> str:
    share = 0.0 if st is None else (1.0 if st.state == JobState.DONE else st.progress)
    label = f"{share:.0%}" + (f": {doing}" if doing else "")
    return (
        f'<div class="arr-progress"><div class="arr-progress-fill" style="width:{share * 100:.1f}%"></div>'
        f"<span>{label}</span></div>"
    )


def batch_results_file(job_id: str, owner: str | None = None) -> str:
    """The results zip, copied once per job into a temp folder Gradio may serve."""
    src = Path(service.executor().batch_results(job_id, owner=owner))
    dst = served(f"batch-{job_id}") / f"arrcoc-{job_id}.zip"
    stat = src.stat()
    if not dst.exists() or dst.stat().st_size != stat.st_size or dst.stat().st_mtime < stat.st_mtime:
        tmp = dst.with_suffix(".part")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    return str(dst)


# ---- benchmark --------------------------------------------------------------------------------


def bench_request(
    variant: object, backends: object, buckets: object, iterations: object, device: object
) -> BenchRequest:
    if not backends:
        raise InvalidInputError("Choose at least one backend.")
    if not buckets:
        raise InvalidInputError("Choose at least one batch bucket.")
    if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
        raise InvalidInputError("Backends must be a list of names.")
    if not isinstance(buckets, list) or not all(
        isinstance(b, str | int) and str(b).isdigit() for b in buckets
    ):
        raise InvalidInputError("Buckets must be a list of whole numbers.")
    n = whole(iterations, "Iterations")
    return BenchRequest(
        variants=(text_field(variant, "The variant"),),
        backends=tuple(backends),
        buckets=tuple(sorted(int(b) for b in buckets)),
        iterations=n,
        warmup=max(1, min(10, n // 5)),
        device=text_field(device, "The device"),
    )


def submit_bench(
    variant: object,
    backends: object,
    buckets: object,
    iterations: object,
    device: object,
    owner: str | None = None,
) -> str:
    req = bench_request(variant, backends, buckets, iterations, device)
    return service.executor().submit_bench(req, owner=owner)  # checked against the server's caps there
