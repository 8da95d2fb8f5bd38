"""A finished batch job on the page: a gallery of its overlays, its failures and its status as JSON.

Everything is read from the job's results.zip (results.jsonl, one row per item, and overlays/):
the same file a user downloads, so the page shows what the zip holds.
"""

from __future__ import annotations

import base64
import io
import json
import zipfile
from html import escape
from pathlib import Path
from typing import Any

from PIL import Image

from arrcoc.service.jobs.types import JobStatus

GALLERY_MAX = 60  # overlays shown on the page; the zip holds them all
THUMB_SIDE = 320


def item_rows(zip_path: str | Path) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The zip's results.jsonl rows and its overlay file names by item index."""
    with zipfile.ZipFile(zip_path) as zf:
        names = zf.namelist()
        rows = [json.loads(line) for line in zf.read("results.jsonl").decode().splitlines() if line.strip()] if "results.jsonl" in names else []
    overlays = {}
    for n in names:
        stem = Path(n).name
        if n.startswith("overlays/") and stem[:5].isdigit():
            overlays[int(stem[:5])] = n
    return rows, overlays


def top_cell(result: dict[str, Any]) -> dict[str, int] | None:
    """The most relevant cell as row and column of the grid."""
    selected, grid = result.get("selected") or [], result.get("grid")
    if not selected or not grid:
        return None
    row, col = divmod(int(selected[0]), int(grid))
    return {"row": row, "col": col}


def item_json(row: dict[str, Any]) -> dict[str, Any]:
    """One item for the API: file, query, ok, and the match score and top cell, or why it failed."""
    r = row.get("result") or {}
    out: dict[str, Any] = {"index": row.get("index"), "file": row.get("file"), "query": row.get("query"), "ok": bool(row.get("ok"))}
    if row.get("ok"):
        out.update(match_score=r.get("match_score"), weak_match=r.get("weak_match"), top_cell=top_cell(r),
                   tokens_used=r.get("tokens_used"), backend=r.get("backend"))  # fmt: skip
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
    return (f'<figure class="arr-item"><img src="{uri}" alt="{file}"><figcaption><b>{file}</b><br>“{query}”<br>'
            f"{match}{where}</figcaption></figure>")  # fmt: skip


def failures_markdown(items: list[dict[str, Any]], st: JobStatus | None = None) -> str:
    failed = [i for i in items if not i["ok"]]
    if not failed:
        return "" if st is None or not st.failed else f"{st.failed} item(s) failed; the reasons come with the results."
    lines = "\n".join(f"| {i['file']} | {str(i['error']).replace('|', '/')} |" for i in failed)
    return f"**{len(failed)} item(s) failed:**\n\n| file | reason |\n|---|---|\n{lines}"


def gallery(zip_path: str | Path) -> tuple[str, str]:
    """The overlays of the first GALLERY_MAX items that worked, as HTML figures with their captions
    (a gallery component's captions cover the picture and cut long text), and the failures."""
    rows, overlays = item_rows(zip_path)
    items = [item_json(r) for r in rows]
    figures = []
    with zipfile.ZipFile(zip_path) as zf:
        for row, item in zip(rows, items, strict=True):
            name = overlays.get(int(row.get("index", -1)))
            if not item["ok"] or name is None or len(figures) >= GALLERY_MAX:
                continue
            figures.append(figure_html(_thumb_uri(zf.read(name)), item))
    note = failures_markdown(items)
    ok = sum(i["ok"] for i in items)
    if ok > len(figures):
        note = f"Showing {len(figures)} of {ok} overlays; the zip holds them all.\n\n" + note
    return f'<div class="arr-gallery">{"".join(figures)}</div>' if figures else "", note


def status_json(st: JobStatus, zip_path: str | Path | None) -> dict[str, Any]:
    """A job's status as plain JSON (the /batch_status API); its items once the results exist."""
    doc: dict[str, Any] = {
        "job_id": st.job_id, "kind": st.kind.value, "state": st.state.value, "finished": st.state.finished,
        "total": st.total, "done": st.done, "failed": st.failed, "progress": round(st.progress, 4),
        "message": st.message, "queue_position": st.queue_position, "created_at": st.created_at, "updated_at": st.updated_at,
    }  # fmt: skip
    if zip_path:
        doc["items"] = [item_json(r) for r in item_rows(zip_path)[0]]
    return doc
