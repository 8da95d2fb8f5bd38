"""Batch and benchmark tabs: submit through the executor, poll status, fetch results and reports."""

from __future__ import annotations

import io
import json
import shutil
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import pandas as pd

from arrcoc.errors import ArrcocError, InvalidInputError
from arrcoc.request import Controls
from arrcoc.service.jobs.types import BenchRequest, JobState, JobStatus

from . import service

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
RESULT_COLUMNS = (
    "variant", "backend", "bucket", "p50_ms", "p99_ms", "throughput_per_s", "speedup_vs_eager",
    "max_abs_diff", "topk_agreement", "compile_s", "capture_s",
)  # fmt: skip -- the report schema of the benchmark harness (arrcoc/bench)
MANIFEST_SUFFIXES = (".csv", ".jsonl")
STATE_COLOUR = {
    JobState.PENDING: "#a3a3a3", JobState.RUNNING: "#6366f1", JobState.DONE: "#16a34a",
    JobState.FAILED: "#dc2626", JobState.CANCELLED: "#f59e0b", JobState.EXPIRED: "#737373",
}  # fmt: skip


# ---- batch ------------------------------------------------------------------------------------


def build_archive(zip_path: str | None, manifest_path: str | None) -> bytes:
    """The uploaded zip, with an uploaded manifest (CSV or JSONL: file,query) added to it."""
    if not zip_path:
        raise InvalidInputError("Upload a .zip of images first.")
    data = Path(zip_path).read_bytes()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            names = zf.namelist()
            if not any(not n.endswith("/") for n in names):
                raise InvalidInputError("The zip is empty: put some images in it.")
            if not manifest_path:
                return data
            suffix = Path(manifest_path).suffix.lower()
            if suffix not in MANIFEST_SUFFIXES:
                raise InvalidInputError("The manifest must be a .csv or .jsonl file with columns file,query.")
            out = io.BytesIO()
            with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
                for info in zf.infolist():
                    if Path(info.filename).name not in ("manifest.csv", "manifest.jsonl"):
                        dst.writestr(info, zf.read(info))
                dst.writestr(f"manifest{suffix}", Path(manifest_path).read_bytes())
            return out.getvalue()
    except zipfile.BadZipFile as e:
        raise InvalidInputError("That file is not a readable .zip archive.") from e


def submit_batch(zip_path: str | None, manifest_path: str | None, query: str, controls: Controls) -> str:
    archive = build_archive(zip_path, manifest_path)
    q = (query or "").strip() or None
    if q is None and not manifest_path and not _zip_has_manifest(archive):
        raise InvalidInputError("Type a query for every image, or add a manifest (file,query) to the zip.")
    return service.executor().submit_batch(archive, q, controls)


def _zip_has_manifest(archive: bytes) -> bool:
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        return any(Path(n).name in ("manifest.csv", "manifest.jsonl") for n in zf.namelist())


def job_status(job_id: str) -> JobStatus:
    job_id = (job_id or "").strip()
    if not job_id:
        raise InvalidInputError("Paste a job id first.")
    return service.executor().status(job_id)


def status_markdown(st: JobStatus) -> str:
    dot = f"<span style='color:{STATE_COLOUR.get(st.state, '#888')}'>●</span>"
    lines = [f"{dot} **{st.state.value}** — {st.kind.value} job `{st.job_id}`"]
    if st.total:
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


def progress_html(st: JobStatus | None) -> str:
    share = 0.0 if st is None else (1.0 if st.state == JobState.DONE else st.progress)
    return (
        f'<div class="arr-progress"><div class="arr-progress-fill" style="width:{share * 100:.1f}%"></div>'
        f"<span>{share:.0%}</span></div>"
    )


def batch_results_file(job_id: str) -> str:
    """A copy of the results zip in a temp folder Gradio may serve."""
    src = Path(service.executor().batch_results(job_id))
    dst = Path(tempfile.mkdtemp(prefix="arrcoc-batch-")) / f"arrcoc-{job_id}.zip"
    shutil.copyfile(src, dst)
    return str(dst)


# ---- benchmark --------------------------------------------------------------------------------


def submit_bench(variant: str, backends: list[str], buckets: list[str], iterations: int, device: str) -> str:
    if not backends:
        raise InvalidInputError("Choose at least one backend.")
    if not buckets:
        raise InvalidInputError("Choose at least one batch bucket.")
    req = BenchRequest(
        variants=(variant,), backends=tuple(backends), buckets=tuple(sorted(int(b) for b in buckets)),
        iterations=int(iterations), warmup=max(1, min(10, int(iterations) // 5)), device=device,
    )  # fmt: skip
    return service.executor().submit_bench(req)


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    rows = doc.get("results") if isinstance(doc, dict) else None
    if isinstance(rows, list) and any(isinstance(r, dict) and {"backend", "bucket", "p50_ms"} <= r.keys() for r in rows):
        return doc
    return None  # other JSON under benchmarks/ (batching studies, ...) is not a benchmark report


def stored_reports(folder: Path | None = None) -> list[str]:
    """File names of the benchmark reports under benchmarks/: newest day first, and within a day
    the most complete report (most result rows) first. File times mean nothing after a clone."""
    folder = BENCH_DIR if folder is None else folder
    reports = [(f, _read_report(f)) for f in sorted(folder.glob("*.json"))] if folder.is_dir() else []

    def rank(item: tuple[Path, dict[str, Any]]) -> tuple[str, int, str]:
        f, rep = item
        return (str(rep.get("env", {}).get("date", ""))[:10], len(rep.get("results", [])), f.name)

    return [f.name for f, rep in sorted((r for r in reports if r[1] is not None), key=rank, reverse=True)]


def stored_report(name: str, folder: Path | None = None) -> dict[str, Any] | None:
    folder = BENCH_DIR if folder is None else folder
    return _read_report(folder / Path(name).name) if name else None  # a bare name: no paths from the page


def newest_report(folder: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """The newest stored report under benchmarks/ and its file name (None when there is none)."""
    names = stored_reports(folder)
    return (stored_report(names[0], folder), names[0]) if names else (None, "")


def report_frame(report: dict[str, Any] | None) -> pd.DataFrame:
    """The report's results as a table; speedup vs eager derived from p50 where the report lacks it."""
    rows = [r for r in (report or {}).get("results") or [] if isinstance(r, dict)]
    df = pd.DataFrame([{c: r.get(c) for c in RESULT_COLUMNS} for r in rows], columns=list(RESULT_COLUMNS))
    if rows and df["throughput_per_s"].isna().all():
        df["throughput_per_s"] = [r.get("images_per_s") for r in rows]
    for c in RESULT_COLUMNS[2:]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    if rows and df["speedup_vs_eager"].isna().all():
        eager = df[df["backend"] == "eager"].set_index(["variant", "bucket"])["p50_ms"]
        ref = [eager.get((v, b)) for v, b in zip(df["variant"], df["bucket"], strict=True)]
        df["speedup_vs_eager"] = pd.to_numeric(pd.Series(ref), errors="coerce") / df["p50_ms"]
    errors = [r.get("error") for r in rows]
    if any(errors):
        df["error"] = errors
    df = df.round({"p50_ms": 3, "p99_ms": 3, "throughput_per_s": 2, "speedup_vs_eager": 2, "max_abs_diff": 8,
                   "topk_agreement": 4, "compile_s": 2, "capture_s": 2})  # fmt: skip
    return df.dropna(axis=1, how="all") if rows else df


def report_markdown(report: dict[str, Any] | None, source: str) -> str:
    if not report:
        return "**No benchmark report yet.** Run one above; the newest stored report (`benchmarks/*.json`) is shown here once it exists."
    env = report.get("env") or {}
    bits = [f"{k} `{env[k]}`" for k in ("gpu", "torch", "triton", "onnxruntime", "cuda", "driver", "date", "commit") if env.get(k)]
    rec = report.get("recompiles_after_warmup")
    tail = f" · recompiles after warmup: **{rec}**" if rec is not None else ""
    return f"**{source}** (schema {report.get('schema', '?')}) — " + " · ".join(bits) + tail


def report_files(report: dict[str, Any], stem: str) -> list[str]:
    folder = Path(tempfile.mkdtemp(prefix="arrcoc-bench-"))
    (folder / f"{stem}.json").write_text(json.dumps(report, indent=2))
    report_frame(report).to_csv(folder / f"{stem}.csv", index=False)
    return [str(folder / f"{stem}.json"), str(folder / f"{stem}.csv")]


def friendly(e: Exception) -> str:
    """A user-facing message for any job error."""
    if isinstance(e, ArrcocError):
        return str(e)
    return f"Something went wrong on the server ({type(e).__name__}). Try again; details are in the server log."
