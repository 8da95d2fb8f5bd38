"""A finished batch job on the page: a gallery of its overlays, its failures and its status as JSON.

The gallery is read from the job's results.zip (results.parquet's small columns, one row per item,
and overlays/): the same file a user downloads, so the page shows what the zip holds. A job drawn
without overlays shows each item's relevance map from results.parquet's maps instead. The status
is the job record's counts and the results' link: its cost does not grow with the job.
"""

from __future__ import annotations

import base64
import io
import zipfile
from html import escape
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image

from arrcoc.render import heatmap_image
from arrcoc.service.jobs.results import RESULTS_NAME
from arrcoc.service.jobs.types import JobStatus

from .jobs import status_doc

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


def _jpeg_uri(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=82)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _thumb_uri(data: bytes) -> str:
    with Image.open(io.BytesIO(data)) as im:
        thumb = im.convert("RGB")
        thumb.thumbnail((THUMB_SIDE, THUMB_SIDE))
    return _jpeg_uri(thumb)


def _map_uris(zip_path: str | Path, rows: list[int]) -> dict[int, str]:
    """Thumbnails of these rows' relevance maps (results.parquet's `relevance`), each at its photo's
    aspect ratio: the pictures of a job drawn without overlays. Reads row groups only as far as the
    last row asked for."""
    wanted, out, start = set(rows), {}, 0
    if not wanted:
        return out
    with zipfile.ZipFile(zip_path) as zf:
        f = pq.ParquetFile(io.BytesIO(zf.read(RESULTS_NAME)))
    columns = ["relevance", "image_width", "image_height"]
    for batch in f.iter_batches(batch_size=GALLERY_MAX, columns=columns):
        for i, row in enumerate(batch.to_pylist(), start):
            if i in wanted and row["relevance"] is not None:
                values = np.asarray(row["relevance"], dtype=np.float64)
                grid = int(round(np.sqrt(values.size)))
                w, h = row["image_width"] or 1, row["image_height"] or 1
                size = (
                    (THUMB_SIDE, max(1, round(THUMB_SIDE * h / w)))
                    if w >= h
                    else (
                        max(1, round(THUMB_SIDE * w / h)),
                        THUMB_SIDE,
                    )
                )
                # as the page's maps by default: from 0 to the map's peak on a square-root scale,
                # so faint cells stay visible beside the peak
                peak = max(float(values.max()), 1e-6)
                shown = np.sqrt(np.clip(values / peak, 0.0, 1.0)).reshape(grid, grid)
                out[i] = _jpeg_uri(heatmap_image(shown, size))
        start += batch.num_rows
        if start > max(wanted):
            break
    return out


def figure_html(uri: str, item: dict[str, Any], what: str = "") -> str:
    """One picture with its caption under it: file, query, match score (weak ones marked), top
    cell, and what the picture is when it is not the job's overlay."""
    score, cell = item.get("match_score"), item.get("top_cell")
    match = "match n/a" if score is None else f"match <b>{score:.2f}</b>"
    if item.get("weak_match"):
        match += ' <span class="arr-weak">weak match</span>'
    where = f"<br>top cell: row {cell['row']}, col {cell['col']}" if cell else ""
    file, query = escape(str(item["file"])), escape(str(item["query"]))
    note = f'<br><span class="arr-caption">{escape(what)}</span>' if what else ""
    return (
        f'<figure class="arr-item"><img src="{uri}" alt="{file}"><figcaption><b>{file}</b><br>“{query}”<br>'
        f"{match}{where}{note}</figcaption></figure>"
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


MAP_NOTE = "relevance map (no overlays drawn)"


def gallery(zip_path: str | Path) -> tuple[str, str]:
    """The pictures of the first GALLERY_MAX items that worked, as HTML figures with their captions
    (a gallery component's captions cover the picture and cut long text), and the failures. An
    item without an overlay (a job that drew none) shows its relevance map."""
    items = item_rows(zip_path)
    shown = [(i, item) for i, item in enumerate(items) if item["ok"]][:GALLERY_MAX]
    maps = _map_uris(zip_path, [i for i, item in shown if not item.get("overlay")])
    figures = []
    with zipfile.ZipFile(zip_path) as zf:
        for i, item in shown:
            if item.get("overlay"):
                figures.append(figure_html(_thumb_uri(zf.read(item["overlay"])), item))
            elif i in maps:
                figures.append(figure_html(maps[i], item, MAP_NOTE))
    note = failures_markdown(items)
    ok = sum(i["ok"] for i in items)
    what = "relevance maps" if maps else "overlays"
    if ok > len(figures):
        note = f"Showing {len(figures)} of {ok} {what}; the zip holds them all.\n\n" + note
    return f'<div class="arr-gallery">{"".join(figures)}</div>' if figures else "", note


def status_json(st: JobStatus, zip_path: str | Path | None) -> dict[str, Any]:
    """A job's status as plain JSON (the /batch_status API): the job record's counts, and once the
    results exist, what the results file holds (it comes with the reply as a file; its rows are
    read from it, not from here)."""
    doc = status_doc(st)
    if zip_path:
        with zipfile.ZipFile(zip_path) as zf:  # the central directory only
            drawn = any(n.startswith("overlays/") for n in zf.namelist())
        doc["results"] = {
            "file": Path(zip_path).name,
            "rows": RESULTS_NAME,
            "summary": "summary.csv",
            "overlays": "overlays/" if drawn else None,  # None: the job was submitted with overlays "none"
        }
    return doc


__all__ = ["gallery", "item_rows", "status_json"]
