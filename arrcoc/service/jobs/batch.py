"""Batch jobs: create from a zip, run a chunk, finalize, fetch the results zip.

A batch job lives in the data store (`<data_dir>/jobs/<id>/`: inputs/, items.jsonl, results/,
overlays/, results.zip) and in the job store (state, progress). Each chunk is one bucket of
items. Every step is idempotent: an item already recorded is skipped, per-item files are written
atomically, and results.zip is built from those files in index order, so a chunk redelivered
after a worker died adds no duplicate rows.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import secrets
import shutil
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from ...errors import ArrcocError, JobError
from ...render import overlay
from ...request import Controls, validate_image
from ...settings import Settings
from ..codec import error_to_wire
from .archive import Item, load_items, unpack
from .files import atomic_write, job_dir, new_job_id
from .store import JobStore
from .types import JobKind, JobState

if TYPE_CHECKING:
    from ...pipeline import PreparedRequest
    from ..host.interface import EngineHost

log = logging.getLogger(__name__)

OVERLAY_MAX_SIDE = 1024


def create_batch_job(
    archive: bytes, query: str | None, controls: Controls | None, settings: Settings, store: JobStore,
    owner: str | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """Check and unpack the zip, record the job; returns its id and its chunks [start, stop).
    Expired jobs' files are removed by the reaper (files.Reaper), not here."""
    job_id = new_job_id(JobKind.BATCH)
    jd = job_dir(settings, job_id)
    jd.mkdir(parents=True)
    try:
        items = unpack(archive, query, jd, settings)
        chunk = max(1, min(settings.batch_max_size, max(settings.buckets)))
        meta = {"job_id": job_id, "kind": "batch", "query": query, "controls": (controls or Controls()).to_wire(),
                "total": len(items), "chunk": chunk, "expires_at": time.time() + settings.job_ttl_s}  # fmt: skip
        (jd / "job.json").write_text(json.dumps(meta))
        store.create(job_id, JobKind.BATCH, len(items), settings.job_ttl_s,
                     {"controls": meta["controls"], "chunk": str(chunk)} | ({"owner": owner} if owner else {}))  # fmt: skip
    except BaseException:
        shutil.rmtree(jd, ignore_errors=True)
        raise
    return job_id, [(i, min(i + chunk, len(items))) for i in range(0, len(items), chunk)]


# -- running a chunk --------------------------------------------------------------------------
def _write_item(jd: Path, it: Item, image: Image.Image | None, row: dict[str, Any]) -> None:
    (jd / "results").mkdir(exist_ok=True)
    if image is not None and row.get("ok"):
        (jd / "overlays").mkdir(exist_ok=True)
        img = image.copy()
        img.thumbnail((OVERLAY_MAX_SIDE, OVERLAY_MAX_SIDE))
        buf = io.BytesIO()
        overlay(img, row["_relevance"]).save(buf, "PNG")
        atomic_write(jd / "overlays" / f"{it.index:05d}.png", buf.getvalue())
    row.pop("_relevance", None)
    atomic_write(jd / "results" / f"{it.index:05d}.json", json.dumps(row).encode())


def _fail_item(jd: Path, store: JobStore, job_id: str, it: Item, message: str) -> None:
    _write_item(jd, it, None, {"index": it.index, "file": it.file, "query": it.query, "ok": False, "error": message})
    store.mark_item(job_id, it.index, message)


def run_chunk(
    job_id: str, start: int, stop: int, host: EngineHost, store: JobStore, settings: Settings,
    deadline: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Process items [start, stop) of a batch job; skips what is already recorded."""
    rec = store.record(job_id)
    state = JobState(rec["state"])
    if state in (JobState.CANCELLED, JobState.EXPIRED, JobState.FAILED):
        return {"job_id": job_id, "skipped": state.value}
    store.set_state(job_id, JobState.RUNNING, expect=(JobState.PENDING,))
    jd = job_dir(settings, job_id)
    controls = Controls.from_wire(json.loads(rec.get("controls") or "{}"))
    todo = [it for it in load_items(jd)[start:stop] if not store.item_finished(job_id, it.index)]
    fresh: list[Item] = []
    suspect: list[Item] = []
    for it in todo:
        n = store.attempt(job_id, it.index)
        if n > settings.max_redeliveries:
            _fail_item(jd, store, job_id, it, f"Skipped after {n - 1} attempts: the worker stopped each time"
                       " it processed this item (crash, out of memory or time limit).")  # fmt: skip
        else:
            (suspect if n > 1 else fresh).append(it)
    processed = 0
    for group in [fresh] + [[it] for it in suspect]:  # after a crash, suspects run alone
        if not group:
            continue
        if JobState(store.record(job_id)["state"]) == JobState.CANCELLED:
            return {"job_id": job_id, "skipped": "cancelled", "processed": processed}
        if deadline is not None and time.monotonic() > deadline:
            for it in group:
                _fail_item(jd, store, job_id, it, "The chunk ran past its time limit; this item was not processed.")
            continue
        processed += _run_group(job_id, jd, group, controls, host, store, settings)
    maybe_finalize(job_id, store, settings)
    return {"job_id": job_id, "processed": processed}


def _run_group(job_id: str, jd: Path, group: list[Item], controls: Controls, host: EngineHost, store: JobStore,
               settings: Settings) -> int:  # fmt: skip
    ready: list[tuple[Item, Image.Image, PreparedRequest]] = []
    for it in group:  # a bad image or query fails its item, not the group
        try:
            img = validate_image((jd / it.path).read_bytes(), settings)
            ready.append((it, img, host.prepare(img, it.query, controls)))
        except ArrcocError as e:
            _fail_item(jd, store, job_id, it, str(e))
    if not ready:
        return 0
    step = host.max_batch
    results = []
    for i in range(0, len(ready), step):
        results += host.run_batch([r[2] for r in ready[i : i + step]])
    for (it, img, _), res in zip(ready, results, strict=True):
        if isinstance(res, BaseException):
            _fail_item(jd, store, job_id, it, error_to_wire(res)["message"])
            continue
        row = {"index": it.index, "file": it.file, "query": it.query, "ok": True, "error": None,
               "result": res.to_json(), "_relevance": res.relevance}  # fmt: skip
        _write_item(jd, it, img, row)
        store.mark_item(job_id, it.index)
    return len(ready)


# -- finishing ------------------------------------------------------------------------------------
def maybe_finalize(job_id: str, store: JobStore, settings: Settings) -> bool:
    """Once every item is recorded, build results.zip and mark the job done. Idempotent."""
    st = store.status(job_id)
    if st.done + st.failed < st.total or st.state in (JobState.CANCELLED, JobState.EXPIRED):
        return False
    jd = job_dir(settings, job_id)
    if not (jd / "results.zip").exists() or st.state != JobState.DONE:
        build_results_zip(jd)
    if st.state.finished:
        return True
    if st.done == 0 and st.total:
        first = next(iter(store.failed_items(job_id).values()), "")
        return store.set_state(job_id, JobState.FAILED, f"Every item failed; the first: {first}",
                               expect=(JobState.PENDING, JobState.RUNNING))  # fmt: skip
    note = f"{st.failed} of {st.total} items failed; see summary.csv." if st.failed else ""
    return store.set_state(job_id, JobState.DONE, note, expect=(JobState.PENDING, JobState.RUNNING))


SUMMARY_FIELDS = ("index", "file", "query", "status", "error", "overlay", "k", "tokens_used", "top_cell",
                  "weight_information", "weight_perspectival", "weight_participatory", "backend", "bucket")  # fmt: skip


def _summary_row(row: dict[str, Any], overlay_name: str | None) -> dict[str, Any]:
    r = row.get("result") or {}
    bal = dict(zip(r.get("balance_names", []), r.get("balance", []), strict=False))
    return {"index": row["index"], "file": row["file"], "query": row["query"],
            "status": "ok" if row["ok"] else "failed", "error": row.get("error") or "",
            "overlay": overlay_name or "", "k": r.get("k", ""), "tokens_used": r.get("tokens_used", ""),
            "top_cell": (r.get("selected") or [""])[0], "weight_information": bal.get("information", ""),
            "weight_perspectival": bal.get("perspectival", ""), "weight_participatory": bal.get("participatory", ""),
            "backend": r.get("backend", ""), "bucket": r.get("bucket", "")}  # fmt: skip


def build_results_zip(jd: Path) -> Path:
    """results.zip: overlays/*.png, results.jsonl and summary.csv, one row per recorded item."""
    jsonl = io.StringIO()
    csv_buf = io.StringIO()
    writer = csv.DictWriter(csv_buf, fieldnames=SUMMARY_FIELDS)
    writer.writeheader()
    tmp = jd / f".results.{secrets.token_hex(4)}.zip"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted((jd / "results").glob("*.json")) if (jd / "results").is_dir() else ():
            row = json.loads(path.read_text())
            png = jd / "overlays" / f"{row['index']:05d}.png"
            name = None
            if row["ok"] and png.exists():
                stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(row["file"]).stem)[:80]
                name = f"overlays/{row['index']:05d}_{stem}.png"
                zf.write(png, name, compress_type=zipfile.ZIP_STORED)
            jsonl.write(json.dumps(row) + "\n")
            writer.writerow(_summary_row(row, name))
        zf.writestr("results.jsonl", jsonl.getvalue())
        zf.writestr("summary.csv", csv_buf.getvalue())
    os.replace(tmp, jd / "results.zip")
    return jd / "results.zip"


def results_zip(job_id: str, store: JobStore, settings: Settings) -> Path:
    st = store.status(job_id)
    if st.state == JobState.EXPIRED:
        raise JobError(f"Job {job_id} expired; its results were deleted. Submit it again.")
    if st.kind != JobKind.BATCH:
        raise JobError(f"Job {job_id} is a {st.kind.value} job; it has a report, not a results zip.")
    jd = job_dir(settings, job_id)
    if st.state == JobState.CANCELLED:  # whatever finished before the cancel
        return build_results_zip(jd)
    if st.state not in (JobState.DONE, JobState.FAILED) or not (jd / "results.zip").exists():
        raise JobError(f"Job {job_id} is {st.state.value} ({st.done + st.failed}/{st.total}); fetch it when done.")
    return jd / "results.zip"
