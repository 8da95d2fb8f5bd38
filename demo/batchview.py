"""A finished batch job on the page: a gallery of its overlays, its failures and its status as JSON.

The gallery is read from the job's results.zip (results.parquet's small columns, one row per item,
and overlays/): the same file a user downloads, so the page shows what the zip holds. The status
is the job record's counts and the results' link: its cost does not grow with the job.
"""

from __future__ import annotations

import base64
import io
import zipfile
from html import escape
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from arrcoc.service.jobs.results import RESULTS_NAME
from arrcoc.service.jobs.types import JobStatus

GALLERY_MAX = 60  # overlays shown on the page; the zip holds them all
THUMB_SIDE = 320


# what the page shows of an item: results.parquet's small columns (no maps)
ITEM_COLUMNS = [
    "index",
    "file",
    "query",
    "status",
    "error",
    "overlay",
    "match_score",
    "weak_match",
    "tokens_used",
    "backend",
    "selected",
    "grid",
]


def item_rows(zip_path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """The first `limit` (all: None) items of the zip's results.parquet as the API shows them."""
    with zipfile.ZipFile(zip_path) as zf:
        if RESULTS_NAME not in zf.namelist():
            return []
        f = pq.ParquetFile(io.BytesIO(zf.read(RESULTS_NAME)))
    columns = [c for c in ITEM_COLUMNS if c in f.schema_arrow.names]
    table = f.read(columns=columns)
    if limit is not None:
        table = table.slice(0, limit)
    if "selected" in columns:  # only the top cell, not K of them
        table = table.set_column(
            table.column_names.index("selected"), "selected", pc.list_element(table["selected"], 0)
        )
    return [item_json(r) for r in table.to_pylist()]


def item_json(row: dict[str, Any]) -> dict[str, Any]:
    """One item for the API: file, query, ok, and the match score and top cell, or why it failed."""
    ok = row.get("status") == "ok"
    out: dict[str, Any] = {
        "index": row.get("index"),
        "file": row.get("file"),
        "query": row.get("query"),
        "ok": ok,
    }
    if ok:
        top, grid = row.get("selected"), row.get("grid")
        cell = (
            {"row": int(top) // int(grid), "col": int(top) % int(grid)} if top is not None and grid else None
        )
        out.update(
            match_score=row.get("match_score"),
            weak_match=row.get("weak_match"),
            top_cell=cell,
            tokens_used=row.get("tokens_used"),
            backend=row.get("backend"),
            overlay=row.get("overlay"),
        )
    else:
        out["error"] = row.get("error") or "failed"
    return out


def _thumb_uri(data: bytes) -> str:
    with Image.open(io.BytesIO(data)) as im:
        thumb = im.convert("RGB")
        thumb.thumbnail((THUMB_SIDE, THUMB_SIDE))
    buf = io.BytesIO()
    thumb.save(buf, format="JPEG", quality=82)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def figure_html(uri: str, item: dict[str, Any]) -> str:
    """One overlay with its caption under it: file, query, match score (weak ones marked), top cell."""
    score, cell = item.get("match_score"), item.get("top_cell")
    match = "match n/a" if score is None else f"match <b>{score:.2f}</b>"
    if item.get("weak_match"):
        match += ' <span class="arr-weak">weak match</span>'
    where = f"<br>top cell: row {cell['row']}, col {cell['col']}" if cell else ""
    file, query = escape(str(item["file"])), escape(str(item["query"]))
    return (
        f'<figure class="arr-item"><img src="{uri}" alt="{file}"><figcaption><b>{file}</b><br>“{query}”<br>'
        f"{match}{where}</figcaption></figure>"
    )


def failures_markdown(items: list[dict[str, Any]], st: JobStatus | None = None) -> str:
    failed = [i for i in items if not i["ok"]]
    if not failed:
        return (
            ""
            if st is None or not st.failed
            else f"{st.failed} item(s) failed; the reasons come with the results."
        )
    lines = "\n".join(f"| {i['file']} | {str(i['error']).replace('|', '/')} |" for i in failed)
    return f"**{len(failed)} item(s) failed:**\n\n| file | reason |\n|---|---|\n{lines}"


def gallery(zip_path: str | Path) -> tuple[str, str]:
    """The overlays of the first GALLERY_MAX items that worked, as HTML figures with their captions
    (a gallery component's captions cover the picture and cut long text), and the failures."""
    items = item_rows(zip_path)
    figures = []
    with zipfile.ZipFile(zip_path) as zf:
        for item in items:
            if item["ok"] and item.get("overlay") and len(figures) < GALLERY_MAX:
                figures.append(figure_html(_thumb_uri(zf.read(item["overlay"])), item))
    note = failures_markdown(items)
    ok = sum(i["ok"] for i in items)
    if ok > len(figures):
        note = f"Showing {len(figures)} of {ok} overlays; the zip holds them all.\n\n" + note
    return f'<div class="arr-gallery">{"".join(figures)}</div>' if figures else "", note


def status_json(st: JobStatus, zip_path: str | Path | None) -> dict[str, Any]:
    """A job's status as plain JSON (the /batch_status API): the job record's counts, and once the
    results exist, what the results file holds (it comes with the reply as a file; its rows are
    read from it, not from here)."""
    doc: dict[str, Any] = {
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
    if zip_path:
        doc["results"] = {
            "file": Path(zip_path).name,
            "rows": RESULTS_NAME,
            "summary": "summary.csv",
            "overlays": "overlays/",
        }
    return doc


__all__ = ["gallery", "item_rows", "status_json"]
