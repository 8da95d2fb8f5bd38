"""Batch jobs: create from a zip, run a chunk, finalize, fetch the results zip.

A batch job lives in the data store (`<data_dir>/jobs/<id>/`: inputs/, items.jsonl, results/,
results.zip) and in the job store (state, progress). Every step is idempotent: an item already
recorded is skipped; each pipeline step's rows and overlays are written atomically as one part
file (results/<time>-<rand>.part.zip) before its items are recorded; results.zip is built from
the parts in index order, one row per item (a part written by a worker that died before recording
it is outlived by the part of the item's rerun), so a redelivered chunk adds no duplicate rows.
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
import struct
import time
import zipfile
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import JobError
from ...request import Controls
from ...settings import OVERLAY_EXTENSIONS, Settings
from .archive import Item, load_items, unpack
from .files import job_dir, new_job_id
from .store import JobStore
from .types import JobKind, JobState

if TYPE_CHECKING:
    from ..host.interface import EngineHost, ProcessedBatch

log = logging.getLogger(__name__)



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
        chunk = max(1, settings.batch_chunk_items)
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
# A chunk runs as a pipeline of steps, bounded (one step read ahead, IN_FLIGHT in the engine host,
# WRITERS being written): while the engine host decodes, runs and renders step k, a thread reads
# step k+1's files and another writes step k-1's results. A step is one engine-host call: decoded
# together (on the GPU when it can), run in the largest buckets, overlays encoded together: two
# engine batches (64 items on a GPU), at least 8 (a CPU runs one at a time) so that progress moves
# on a small job. One call in flight and one writer: two of each ran slower on the H100
# (764 vs 918 images/s, scripts/batch_probe.py): the stages contend for the GIL, not for the device.
STEP_ITEMS = 64
MIN_STEP_ITEMS = 8
IN_FLIGHT = 1
WRITERS = 1


def _row(it: Item, ok: bool, error: str | None = None) -> dict[str, Any]:
    return {"index": it.index, "file": it.file, "query": it.query, "ok": ok, "error": error}


# A part file: one pipeline step's items, written whole. `index.jsonl` holds per item its summary
# (summary.csv's fields, read back without parsing the row), `rows.jsonl` its results.jsonl line,
# `overlays/<index>.<ext>` its picture. One file per step, not two per item: creating files is
# what writing cost (cProfile on the 2-core dev machine: 0.5 ms an open, most of the write stage).
PART_SUFFIX = ".part.zip"


def _write_part(jd: Path, entries: list[tuple[dict[str, Any], bytes | None, str]]) -> None:
    """entries: (row, overlay bytes or None, overlay extension) per item, in index order."""
    name = f"{time.time_ns():020d}-{secrets.token_hex(3)}{PART_SUFFIX}"  # later parts win (see _parts)
    tmp = jd / "results" / f".{name}.tmp"
    index, rows = [], []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for row, picture, ext in entries:
            member = None
            if picture is not None:
                member = f"overlays/{row['index']:05d}{ext}"
                zf.writestr(member, picture)
            index.append(orjson.dumps(_summary_row(row, member)))
            rows.append(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY))
        zf.writestr("index.jsonl", b"\n".join(index))
        zf.writestr("rows.jsonl", b"\n".join(rows))
    os.replace(tmp, jd / "results" / name)


def _fail_items(jd: Path, store: JobStore, job_id: str, failed: list[tuple[Item, str]]) -> None:
    if failed:
        _write_part(jd, [(_row(it, False, message), None, "") for it, message in failed])
        store.mark_items(job_id, [(it.index, message) for it, message in failed])


def run_chunk(
    job_id: str, start: int, stop: int, host: EngineHost, store: JobStore, settings: Settings,
    deadline: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Process items [start, stop) of a batch job; skips what is already recorded."""
    t_chunk = time.perf_counter()
    rec = store.record(job_id)
    state = JobState(rec["state"])
    if state in (JobState.CANCELLED, JobState.EXPIRED, JobState.FAILED):
        return {"job_id": job_id, "skipped": state.value}
    store.set_state(job_id, JobState.RUNNING, expect=(JobState.PENDING,))
    jd = job_dir(settings, job_id)
    (jd / "results").mkdir(exist_ok=True)
    controls = Controls.from_wire(json.loads(rec.get("controls") or "{}"))
    items = load_items(jd)[start:stop]
    finished = store.finished_items(job_id, [it.index for it in items])
    todo = [it for it in items if it.index not in finished]
    attempts = store.attempt_items(job_id, [it.index for it in todo])
    fresh: list[Item] = []
    suspect: list[Item] = []
    skipped: list[tuple[Item, str]] = []
    for it, n in zip(todo, attempts, strict=True):
        if n > settings.max_redeliveries:
            skipped.append((it, f"Skipped after {n - 1} attempts: the worker stopped each time it processed"
                                " this item (crash, out of memory or time limit)."))  # fmt: skip
        else:
            (suspect if n > 1 else fresh).append(it)
    _fail_items(jd, store, job_id, skipped)
    stages: dict[str, float] = {}
    processed = 0
    for group in [fresh] + [[it] for it in suspect]:  # after a crash, suspects run alone
        if not group:
            continue
        done = _run_group(job_id, jd, group, controls, host, store, settings, deadline, stages)
        if done is None:
            return {"job_id": job_id, "skipped": "cancelled", "processed": processed, "stage_ms": stages}
        processed += done
    t_final = time.perf_counter()

    def record() -> None:  # before the job reads as done: whoever sees it done sees its timings too
        _add(stages, "finalize", t_final)
        _add(stages, "chunk", t_chunk)
        store.add_stage_ms(job_id, stages)

    maybe_finalize(job_id, store, settings, before_done=record)
    return {"job_id": job_id, "processed": processed, "stage_ms": stages}


def _read(jd: Path, items: list[Item]) -> list[bytes]:
    out = []
    opened: dict[str, Any] = {}
    try:
        for it in items:
            try:
                out.append(it.read(jd, opened))
            except OSError:
                out.append(b"")  # reported by the decoder as an empty image
    finally:
        for f in opened.values():
            f.close()
    return out


def _run_group(job_id: str, jd: Path, group: list[Item], controls: Controls, host: EngineHost, store: JobStore,
               settings: Settings, deadline: float | None, stages: dict[str, float]) -> int | None:  # fmt: skip
    """The group's items through the pipeline; how many ran, or None if the job was cancelled."""
    size = min(STEP_ITEMS, max(MIN_STEP_ITEMS, 2 * host.max_batch))
    steps = [group[i : i + size] for i in range(0, len(group), size)]
    fmt = settings.overlay_format
    with ThreadPoolExecutor(1, thread_name_prefix="arrcoc-read") as reader, \
            ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="arrcoc-engine") as engine, \
            ThreadPoolExecutor(WRITERS, thread_name_prefix="arrcoc-write") as writer:  # fmt: skip
        reading = reader.submit(_read, jd, steps[0])
        running: deque[tuple[list[Item], Future[ProcessedBatch]]] = deque()
        writing: deque[Future] = deque()
        ran = 0

        def written(future: Future[float]) -> None:  # the writer threads' time, added up here
            stages["write"] = stages.get("write", 0.0) + future.result()

        def write_next() -> None:  # the oldest step in flight, once processed, to a writer
            nonlocal ran
            step, future = running.popleft()
            t0 = time.perf_counter()
            batch = future.result()
            _add(stages, "engine_wait", t0)
            for name, ms in batch.stage_ms.items():
                stages[name] = stages.get(name, 0.0) + ms
            t1 = time.perf_counter()
            if len(writing) == WRITERS:  # back-pressure: WRITERS steps being written at most
                written(writing.popleft())
            _add(stages, "write_wait", t1)
            writing.append(writer.submit(_write_step, job_id, jd, step, batch, fmt, store))
            ran += len(step)

        for k, step in enumerate(steps):
            t0 = time.perf_counter()
            datas = reading.result()
            _add(stages, "read_wait", t0)
            if k + 1 < len(steps):
                reading = reader.submit(_read, jd, steps[k + 1])
            if JobState(store.record(job_id)["state"]) == JobState.CANCELLED:
                for _, future in running:  # what is in flight finishes, unrecorded
                    future.result()
                for future in writing:
                    written(future)
                return None
            if deadline is not None and time.monotonic() > deadline:
                _fail_items(jd, store, job_id, [(it, "The chunk ran past its time limit; this item was not processed.")
                                                for it in step])  # fmt: skip
                continue
            running.append((step, engine.submit(host.process, datas, [it.query for it in step], controls, fmt)))
            if len(running) == IN_FLIGHT:
                write_next()
        while running:
            write_next()
        for future in writing:
            written(future)
    return ran


def _add(stages: dict[str, float], name: str, since: float) -> None:
    stages[name] = stages.get(name, 0.0) + (time.perf_counter() - since) * 1e3


def _write_step(job_id: str, jd: Path, step: list[Item], batch: ProcessedBatch, fmt: str, store: JobStore) -> float:
    """Write the step's part and record its items; the ms it took."""
    t0 = time.perf_counter()
    entries: list[tuple[dict[str, Any], bytes | None, str]] = []
    marks: list[tuple[int, str | None]] = []
    for it, got in zip(step, batch.items, strict=True):
        if got.result is None:
            message = (got.error or {}).get("message", "The item failed.")
            entries.append((_row(it, False, message), None, ""))
            marks.append((it.index, message))
        else:
            row = _row(it, True) | {"result": got.result.to_json(numpy_arrays=True)}
            entries.append((row, got.overlay, OVERLAY_EXTENSIONS.get(fmt, "")))  # "none": no picture
            marks.append((it.index, None))
    _write_part(jd, entries)
    store.mark_items(job_id, marks)
    return (time.perf_counter() - t0) * 1e3


# -- finishing ------------------------------------------------------------------------------------
def maybe_finalize(job_id: str, store: JobStore, settings: Settings,
                   before_done: Callable[[], None] | None = None) -> bool:  # fmt: skip
    """Once every item is recorded, build results.zip and mark the job done. Idempotent.
    `before_done` runs once: between the two, or before returning when the job is not done."""
    st = store.status(job_id)
    if st.done + st.failed < st.total or st.state in (JobState.CANCELLED, JobState.EXPIRED):
        if before_done is not None:
            before_done()
        return False
    jd = job_dir(settings, job_id)
    if not (jd / "results.zip").exists() or st.state != JobState.DONE:
        build_results_zip(jd)
    if before_done is not None:
        before_done()
    if st.state.finished:
        return True
    if st.done == 0 and st.total:
        first = next(iter(store.failed_items(job_id).values()), "")
        return store.set_state(job_id, JobState.FAILED, f"Every item failed; the first: {first}",
                               expect=(JobState.PENDING, JobState.RUNNING))  # fmt: skip
    note = f"{st.failed} of {st.total} items failed; see summary.csv." if st.failed else ""
    return store.set_state(job_id, JobState.DONE, note, expect=(JobState.PENDING, JobState.RUNNING))


# the most relevant cell as its row and column of the grid (a flat index means nothing to a reader)
SUMMARY_FIELDS = ("index", "file", "query", "status", "error", "overlay", "k", "tokens_used", "match_score", "weak_match",
                  "top_row", "top_col", "weight_information", "weight_perspectival", "weight_participatory", "backend",
                  "bucket")  # fmt: skip


def _summary_row(row: dict[str, Any], overlay: str | None) -> dict[str, Any]:
    """summary.csv's fields of a row; `overlay` is the picture's name in its part (renamed in
    results.zip by _zip_name)."""
    r = row.get("result") or {}
    bal = dict(zip(r.get("balance_names", []), r.get("balance", []), strict=False))
    top, grid = (r.get("selected") if r else None), r.get("grid") or 1
    top = None if top is None or len(top) == 0 else int(top[0])
    return {"index": row["index"], "file": row["file"], "query": row["query"],
            "status": "ok" if row["ok"] else "failed", "error": row.get("error") or "",
            "overlay": overlay or "", "k": r.get("k", ""), "tokens_used": r.get("tokens_used", ""),
            "match_score": r.get("match_score", ""), "weak_match": r.get("weak_match", ""),
            "top_row": top // grid if top is not None else "", "top_col": top % grid if top is not None else "",
            "weight_information": bal.get("information", ""),
            "weight_perspectival": bal.get("perspectival", ""), "weight_participatory": bal.get("participatory", ""),
            "backend": r.get("backend", ""), "bucket": r.get("bucket", "")}  # fmt: skip


def _zip_name(summary: dict[str, Any]) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(summary["file"]).stem)[:80]
    return f"overlays/{summary['index']:05d}_{stem}{Path(summary['overlay']).suffix}"


def _parts(jd: Path) -> dict[int, tuple[Path, int, dict[str, Any]]]:
    """index -> (part, line, summary) of every recorded row. Parts are read oldest first, so an
    item written again (its first worker died before recording it) keeps its last row: the one
    the job store recorded."""
    found: dict[int, tuple[Path, int, dict[str, Any]]] = {}
    for path in sorted((jd / "results").glob(f"*{PART_SUFFIX}")) if (jd / "results").is_dir() else ():
        with zipfile.ZipFile(path) as zf:
            for line, text in enumerate(zf.read("index.jsonl").splitlines()):
                summary = orjson.loads(text)
                found[summary["index"]] = (path, line, summary)
    return found


class _PartReader:
    """The parts a results.zip is built from, a few open at a time (their items come mostly in
    index order, part after part): bounded file handles and memory on a job of any size."""

    KEEP = 4

    def __init__(self) -> None:
        self._open: dict[Path, tuple[zipfile.ZipFile, bytes | None, list[bytes] | None]] = {}

    def _get(self, path: Path) -> tuple[zipfile.ZipFile, bytes | None, list[bytes] | None]:
        if path not in self._open:
            if len(self._open) >= self.KEEP:
                self._open.pop(next(iter(self._open)))[0].close()
            self._open[path] = (zipfile.ZipFile(path), None, None)
        return self._open[path]

    def picture(self, path: Path, member: str) -> bytes:
        """The member's bytes read straight from the part, without zipfile's CRC pass (a CRC per
        overlay was a third of building results.zip on the H100 host; results.zip's own CRC,
        computed as it is written, still covers them)."""
        zf = self._get(path)[0]
        info = zf.getinfo(member)
        if info.compress_type != zipfile.ZIP_STORED or zf.fp is None:
            return zf.read(member)
        zf.fp.seek(info.header_offset)
        head = struct.unpack(zipfile.structFileHeader, zf.fp.read(zipfile.sizeFileHeader))
        zf.fp.seek(head[zipfile._FH_FILENAME_LENGTH] + head[zipfile._FH_EXTRA_FIELD_LENGTH], os.SEEK_CUR)
        return zf.fp.read(info.compress_size)

    def rows(self, path: Path, start: int, stop: int) -> bytes:
        """Lines [start, stop) of the part's rows.jsonl, joined by newlines: the whole file as it
        is when they are all its lines (the common case: splitting it cost more than deflating)."""
        zf, blob, lines = self._get(path)
        if blob is None:
            blob = zf.read("rows.jsonl")
        if start == 0 and stop == blob.count(b"\n") + 1:
            self._open[path] = (zf, blob, lines)
            return blob
        if lines is None:
            lines = blob.splitlines()
        self._open[path] = (zf, blob, lines)
        return b"\n".join(lines[start:stop])

    def close(self) -> None:
        for zf, _, _ in self._open.values():
            zf.close()
        self._open.clear()


def _runs(found: dict[int, tuple[Path, int, dict[str, Any]]], order: list[int]) -> Iterator[tuple[Path, int, int]]:
    """(part, start, stop): the rows in index order as runs of consecutive lines of one part."""
    run: list[Any] | None = None
    for i in order:
        path, line, _ = found[i]
        if run is not None and run[0] == path and run[2] == line:
            run[2] += 1
            continue
        if run is not None:
            yield run[0], run[1], run[2]
        run = [path, line, line + 1]
    if run is not None:
        yield run[0], run[1], run[2]


# results.jsonl is deflated in blocks on several threads (zlib lets go of the GIL), each block an
# independent deflate stream ended by a sync flush, as pigz does, while the overlays are copied:
# deflating it on one thread was most of building results.zip (the e2e report's `finalize`)
JSONL_BLOCK = 1 << 21
DEFLATE_LEVEL = 1


def _deflate(block: bytes) -> bytes:
    c = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15)
    return c.compress(block) + c.flush(zlib.Z_SYNC_FLUSH)


class _Deflated:
    """Stands in for zipfile's compressor of one member written block by block: compress()
    returns the block's deflate, made ahead on a thread; flush() ends the stream (an empty final
    block). zipfile itself still counts the sizes and the CRC of what is written."""

    def __init__(self) -> None:
        self.next: Future[bytes] | None = None

    def compress(self, data: bytes) -> bytes:
        assert self.next is not None
        return self.next.result()

    def flush(self) -> bytes:
        return zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15).flush()


def _blocks(rows: Iterator[bytes]) -> Iterator[bytes]:
    """Newline-ended lines (or runs of them) gathered into blocks of about JSONL_BLOCK bytes."""
    buf: list[bytes] = []
    size = 0
    for row in rows:
        buf.append(row)
        size += len(row) + 1
        if size >= JSONL_BLOCK:
            yield b"\n".join(buf) + b"\n"
            buf, size = [], 0
    if buf:
        yield b"\n".join(buf) + b"\n"


def build_results_zip(jd: Path) -> Path:
    """results.zip: overlays/*, results.jsonl and summary.csv, one row per recorded item."""
    found = _parts(jd)
    order = sorted(found)
    csv_buf = io.StringIO()
    writer = csv.DictWriter(csv_buf, fieldnames=SUMMARY_FIELDS)
    writer.writeheader()
    tmp = jd / f".results.{secrets.token_hex(4)}.zip"
    pictures, texts = _PartReader(), _PartReader()
    threads = min(8, os.cpu_count() or 2)
    blocks = _blocks(texts.rows(*run) for run in _runs(found, order))
    window: deque[tuple[bytes, Future[bytes]]] = deque()
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=DEFLATE_LEVEL) as zf, \
                ThreadPoolExecutor(threads, thread_name_prefix="arrcoc-deflate") as pool:  # fmt: skip

            def refill() -> None:  # bounded: at most 2 blocks per thread deflated ahead
                while len(window) < 2 * threads and (block := next(blocks, None)) is not None:
                    window.append((block, pool.submit(_deflate, block)))

            refill()  # results.jsonl deflates while the pictures are copied
            for i in order:  # pictures (already compressed: stored) first; a zip is written a member at a time
                path, _, summary = found[i]
                if summary["overlay"]:
                    name = _zip_name(summary)
                    zf.writestr(name, pictures.picture(path, summary["overlay"]), compress_type=zipfile.ZIP_STORED)
                    summary = summary | {"overlay": name}
                writer.writerow(summary)
            with zf.open("results.jsonl", "w", force_zip64=True) as out:
                deflated = _Deflated()
                if hasattr(out, "_compressor"):  # CPython's zipfile; else it deflates on this thread
                    out._compressor = deflated  # type: ignore[attr-defined]
                while window:
                    block, deflated.next = window.popleft()
                    out.write(block)
                    refill()
            zf.writestr("summary.csv", csv_buf.getvalue())
    finally:
        pictures.close()
        texts.close()
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
