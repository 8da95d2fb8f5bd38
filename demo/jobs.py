"""Batch and benchmark tabs: submit through the executor, poll status, fetch results and reports."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pandas as pd

from arrcoc.errors import ArrcocError, InvalidInputError
from arrcoc.request import Controls
from arrcoc.service.access import RateLimiter, anonymous_owner, check_token, token_owner
from arrcoc.service.jobs import archive as archive_checks
from arrcoc.service.jobs.files import Reaper, sweep_old_files
from arrcoc.service.jobs.types import BenchRequest, JobState, JobStatus
from arrcoc.settings import get_settings

from . import service

log = logging.getLogger("arrcoc.demo")

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


def _text(value: object, what: str) -> str:
    """A text field as the API sent it: None is empty, anything but text is refused."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be text, got {type(value).__name__}.")
    return value


def _upload(path: object, what: str) -> Path | None:
    if path is None or path == "":
        return None
    if not isinstance(path, str):
        raise InvalidInputError(f"{what} must be an uploaded file.")
    return Path(path)


def build_archive(zip_path: str | None, manifest_path: str | None) -> bytes:
    """The uploaded zip, with an uploaded manifest (CSV or JSONL: file,query) added to it.

    Nothing is decompressed here: the zip is inspected from its central directory first (the same
    checks the job runs), and the manifest is appended as one more entry (zip append mode rewrites
    only the directory), so a zip bomb costs its compressed size and no more."""
    zp, mp = _upload(zip_path, "The zip"), _upload(manifest_path, "The manifest")
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
    if mp.stat().st_size > settings.max_manifest_bytes:
        raise InvalidInputError(f"The manifest is over {settings.max_manifest_bytes / 1e6:.0f} MB; split the job.")
    inside = [n for n in names if Path(n).name.lower() in archive_checks.MANIFEST_NAMES]
    if inside:
        raise InvalidInputError(f"The zip already holds a manifest ({inside[0]}); upload the zip alone, or remove"
                                " it from the zip to use the one uploaded here.")  # fmt: skip
    raw = mp.read_bytes()
    archive_checks.decode_manifest(raw, mp.name)  # not UTF-8: said now, in words
    out = io.BytesIO(data)
    with zipfile.ZipFile(out, "a", zipfile.ZIP_DEFLATED) as dst:
        dst.writestr(f"manifest{suffix}", raw)
    return out.getvalue()


def submit_batch(zip_path: str | None, manifest_path: str | None, query: object, controls: Controls,
                 owner: str | None = None) -> str:  # fmt: skip
    q = _text(query, "The query").strip() or None
    archive = build_archive(zip_path, manifest_path)
    if q is None and not manifest_path and not _zip_has_manifest(archive):
        raise InvalidInputError("Type a query for every image, or add a manifest (file,query) to the zip.")
    return service.executor().submit_batch(archive, q, controls, owner=owner)


def _zip_has_manifest(archive: bytes) -> bool:
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        return any(Path(n).name in archive_checks.MANIFEST_NAMES for n in zf.namelist())


def job_status(job_id: object, owner: str | None = None) -> JobStatus:
    job_id = _text(job_id, "The job id").strip()
    if not job_id:
        raise InvalidInputError("Paste a job id first.")
    return service.executor().status(job_id, owner=owner)


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


def _served(name: str) -> Path:
    """A path under the demo's own temp folder (swept by the housekeeper): one per name, so a
    poll of a finished job reuses the file its first poll made instead of leaving a new copy."""
    folder = TEMP_ROOT / name
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)  # in use: the sweep goes by age
    return folder


def batch_results_file(job_id: str, owner: str | None = None) -> str:
    """The results zip, copied once per job into a temp folder Gradio may serve."""
    src = Path(service.executor().batch_results(job_id, owner=owner))
    dst = _served(f"batch-{job_id}") / f"arrcoc-{job_id}.zip"
    stat = src.stat()
    if not dst.exists() or dst.stat().st_size != stat.st_size or dst.stat().st_mtime < stat.st_mtime:
        tmp = dst.with_suffix(".part")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    return str(dst)


# ---- benchmark --------------------------------------------------------------------------------


def _whole(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value in (float("inf"), float("-inf")):
        raise InvalidInputError(f"{what} must be a number, got {value!r}.")
    if int(value) != value:
        raise InvalidInputError(f"{what} must be a whole number, got {value!r}.")
    return int(value)


def submit_bench(variant: object, backends: object, buckets: object, iterations: object, device: object,
                 owner: str | None = None) -> str:  # fmt: skip
    if not backends:
        raise InvalidInputError("Choose at least one backend.")
    if not buckets:
        raise InvalidInputError("Choose at least one batch bucket.")
    if not isinstance(backends, list) or not all(isinstance(b, str) for b in backends):
        raise InvalidInputError("Backends must be a list of names.")
    if not isinstance(buckets, list) or not all(isinstance(b, str | int) and str(b).isdigit() for b in buckets):
        raise InvalidInputError("Buckets must be a list of whole numbers.")
    n = _whole(iterations, "Iterations")
    req = BenchRequest(
        variants=(_text(variant, "The variant"),), backends=tuple(backends), buckets=tuple(sorted(int(b) for b in buckets)),
        iterations=n, warmup=max(1, min(10, n // 5)), device=_text(device, "The device"),
    )  # fmt: skip
    return service.executor().submit_bench(req, owner=owner)  # checked against the server's caps there


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
    """The report as JSON and CSV, written once per report (by content) into the served temp folder."""
    text = json.dumps(report, indent=2)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:80] or "report"
    folder = _served(f"report-{hashlib.sha256(text.encode()).hexdigest()[:16]}")
    json_path, csv_path = folder / f"{stem}.json", folder / f"{stem}.csv"
    if not (json_path.exists() and csv_path.exists()):
        json_path.write_text(text)
        report_frame(report).to_csv(csv_path, index=False)
    return [str(json_path), str(csv_path)]


def friendly(e: Exception) -> str:
    """A user-facing message for any job error: one log line for the user's mistakes, the
    traceback only for real faults."""
    if isinstance(e, ArrcocError):
        log.info("refused: %s: %s", type(e).__name__, str(e)[:300])
        return str(e)
    log.error("demo job handler failed", exc_info=e)
    return f"Something went wrong on the server ({type(e).__name__}). Try again; details are in the server log."


# ---- access: token, owner, rate limits ----------------------------------------------------------

CLIENT_COOKIE = "arrcoc_client"
# sets a random id for this browser once (a cookie, so it survives a refresh): its jobs are bound to it
SET_CLIENT_COOKIE_JS = (
    "() => { if (!document.cookie.split('; ').some(c => c.startsWith('" + CLIENT_COOKIE + "='))) {"
    " const a = new Uint8Array(16); crypto.getRandomValues(a);"
    " const id = Array.from(a, b => b.toString(16).padStart(2, '0')).join('');"
    " document.cookie = '" + CLIENT_COOKIE + "=' + id + '; path=/; max-age=31536000; SameSite=Lax'; } }"
)
_limits: dict[str, RateLimiter] = {}
_limits_lock = threading.Lock()


def _limiter(kind: str) -> RateLimiter:
    s = get_settings()
    per_min = s.rate_limit_infer_per_min if kind == "infer" else s.rate_limit_jobs_per_min
    with _limits_lock:
        lim = _limits.get(kind)
        if lim is None or lim.per_minute != per_min:
            lim = _limits[kind] = RateLimiter(per_min)
        return lim


def _header(request: Any, name: str) -> str:
    headers = getattr(request, "headers", None) or {}
    try:
        return str(headers.get(name) or "")
    except Exception:  # noqa: BLE001 -- an odd request object: no header
        return ""


def request_token(request: Any, typed: object = None) -> str:
    """The API token of a request: the token field, else the X-Arrcoc-Token or Bearer header."""
    text = _text(typed, "The API token").strip()
    if text:
        return text
    bearer = _header(request, "authorization")
    return _header(request, "x-arrcoc-token").strip() or (bearer[7:].strip() if bearer[:7].lower() == "bearer " else "")


def client_address(request: Any) -> str:
    """The client's address: the last X-Forwarded-For hop (the one our proxy added) when present."""
    forwarded = [h.strip() for h in _header(request, "x-forwarded-for").split(",") if h.strip()]
    if forwarded:
        return forwarded[-1]
    client = getattr(request, "client", None)
    return str(getattr(client, "host", "") or "unknown")


def owner_of(request: Any, typed_token: object = None, kind: str = "batch") -> str:
    """Who makes or asks about a job: the token holder, else this browser, else this session.
    AccessDenied when this kind of job needs the token and the request lacks it."""
    owner = check_token(get_settings(), kind, request_token(request, typed_token))
    if owner:
        return owner
    cookies = getattr(request, "cookies", None) or {}
    return anonymous_owner(cookies.get(CLIENT_COOKIE), getattr(request, "session_hash", None))


def rate_limit(request: Any, kind: str, typed_token: object = None) -> None:
    """A per-client cap on submissions ("infer" or "jobs"); AccessDenied past it. Token holders are
    counted by token, everyone else by address."""
    token = request_token(request, typed_token)
    key = token_owner(token) if token and token == get_settings().api_token else client_address(request)
    _limiter(kind).check(key, "requests" if kind == "infer" else "job submissions")


# ---- housekeeping ---------------------------------------------------------------------------------

TEMP_ROOT = Path(tempfile.gettempdir()) / "arrcoc-demo"
_housekeeper: Reaper | None = None


def start_housekeeping() -> Reaper:
    """Once per process: a reaper thread that removes expired jobs' files and this demo's temp files
    older than ARRCOC_TEMP_MAX_AGE_S (Gradio's own cache is swept by Blocks(delete_cache=...))."""
    global _housekeeper
    with _limits_lock:
        if _housekeeper is None:
            s = get_settings()
            _housekeeper = Reaper(s, [lambda: sweep_old_files(TEMP_ROOT, s.temp_max_age_s)]).start()
        return _housekeeper


# ---- strict types at the API boundary ---------------------------------------------------------------

text_field = _text


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{what} must be a number, got {type(value).__name__} {str(value)[:40]!r}.")
    return float(value)


def controls_from(s_info: object, s_persp: object, s_part: object, k: object, budget: object) -> Controls:
    """The sliders as Controls; a value that is not a number (a string, a list) is refused in words,
    never converted. Ranges are checked where the model is known (Controls.validated)."""
    scales = [_number(v, n) for v, n in ((s_info, "The information scale"), (s_persp, "The perspectival scale"),
                                         (s_part, "The participatory scale"))]  # fmt: skip
    return Controls(*scales, _whole(k, "K"), _whole(budget, "The token budget"))


def strict_inputs(blocks: Any) -> None:
    """Every Textbox and Slider of the app refuses a value of the wrong type sent through the API
    (Gradio would turn a number or a list into text, and fail on a string slider with no message):
    the caller gets a clear error instead. Called once on the built Blocks."""
    import gradio as gr

    def wrap(comp: Any, ok: Any, what: str) -> None:
        inner = comp.preprocess

        def preprocess(payload: Any) -> Any:
            if (payload is not None or isinstance(comp, gr.Slider)) and not ok(payload):
                label = comp.label or what
                log.info("refused: %s for %r", type(payload).__name__, label)
                raise gr.Error(f"{label} must be {what}, got {type(payload).__name__}.", title="Cannot run that")
            return inner(payload)

        comp.preprocess = preprocess

    for block in list(getattr(blocks, "blocks", {}).values()):
        if isinstance(block, gr.Textbox):
            wrap(block, lambda v: isinstance(v, str), "text")
        elif isinstance(block, gr.Slider):  # None too: the page always sends a number
            wrap(block, lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number")
        elif isinstance(block, gr.Dropdown) and not block.multiselect:
            wrap(block, lambda v: isinstance(v, str), "one of its choices (text)")
