"""results.zip: a batch job's parts gathered in index order, one row per recorded item.

overlays/* (copied from the parts as they are stored: already compressed), results.jsonl
(deflated in blocks on several threads) and summary.csv; bounded memory on a job of any size.
Built from the parts once every item is recorded (`build_results_zip`), or, when a job runs as
one chunk from its start, as its parts are written (`ResultsZip.add_part`): then finishing it is
all that is left when the last item is recorded.
"""

from __future__ import annotations

import csv
import io
import os
import secrets
import shutil
import time
import zipfile
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .csvcells import safe_rows
from .parts import SUMMARY_FIELDS, PartReader, read_parts, runs, zip_name

# results.jsonl is deflated in blocks on several threads (zlib lets go of the GIL), each block an
# independent deflate stream ended by a sync flush, as pigz does, while the overlays are copied:
# deflating it on one thread was most of building results.zip (the e2e report's `finalize`)
JSONL_BLOCK = 1 << 21
DEFLATE_LEVEL = 1
_END = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15).flush()  # the stream's empty last block


def _deflate(block: bytes) -> bytes:
    c = zlib.compressobj(DEFLATE_LEVEL, zlib.DEFLATED, -15)
    return c.compress(block) + c.flush(zlib.Z_SYNC_FLUSH)


def _copy_pictures(path: Path, summaries: list[dict[str, Any]], pictures: PartReader,
                   out: zipfile.ZipFile) -> list[dict[str, Any]]:  # fmt: skip
    """A run of one part's rows' pictures into results.zip, as stored (already compressed); the
    rows' summaries with the pictures' names there."""
    named = [(s, zip_name(s["index"], s["file"], Path(s["overlay"]).suffix)) for s in summaries if s["overlay"]]
    if not named or (all(s["overlay"] == name for s, name in named)
                     and pictures.copy_pictures(path, [name for _, name in named], out)):  # fmt: skip
        return summaries
    for s, name in named:  # one by one, renamed: a part written before overlays had their final names
        out.writestr(name, pictures.picture(path, s["overlay"]), compress_type=zipfile.ZIP_STORED)
    renamed = {s["index"]: name for s, name in named}
    return [s | {"overlay": renamed[s["index"]]} if s["index"] in renamed else s for s in summaries]


class ResultsZip:
    """results.zip being written: runs of the parts' rows added in index order, then finished.
    Pictures go in as they come; results.jsonl's rows are deflated in blocks on a few threads and
    spooled to a file beside it (a zip is written a member at a time, and the pictures come
    first), its CRC and sizes counted as they come; `finish` appends it and summary.csv.
    `add_part` queues a part on a thread of its own: the job's thread goes on meanwhile."""

    def __init__(self, jd: Path):
        self.jd = jd
        self.path = jd / f".results.{secrets.token_hex(4)}.zip"
        self.next_index = 0  # add_part: the index the next part must begin with
        self.abandoned = self.finished = False
        self._zf = zipfile.ZipFile(self.path, "w", zipfile.ZIP_STORED)
        self._spool = open(self.path.with_suffix(".jsonl.deflate"), "w+b")  # noqa: SIM115 -- closed in _close
        self._threads = min(8, os.cpu_count() or 2)
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="arrcoc-deflate")
        self._window: deque[Future[bytes]] = deque()  # bounded: 2 blocks per thread deflated ahead
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._crc = self._size = 0
        self._csv = io.StringIO()
        self._summary = csv.DictWriter(self._csv, fieldnames=SUMMARY_FIELDS)
        self._summary.writeheader()
        self._parts = PartReader()
        self._queue = ThreadPoolExecutor(1, thread_name_prefix="arrcoc-results-zip")  # add_part's, in order
        self._queued: deque[Future[None]] = deque()
        self.ms = 0.0  # the time add_part's parts took

    def add(self, path: Path, start: int, stop: int, summaries: list[dict[str, Any]]) -> None:
        """Lines [start, stop) of a part, whose summaries are `summaries`."""
        self._summary.writerows(safe_rows(_copy_pictures(path, summaries, self._parts, self._zf)))
        self._pending.append(self._parts.rows(path, start, stop))
        self._pending_size += len(self._pending[-1]) + 1
        if self._pending_size >= JSONL_BLOCK:
            self._deflate_pending()

    def add_part(self, path: Path) -> None:
        """A part just written, whole, queued: added if its rows are the next ones in index
        order; otherwise (items failed apart, a part rewritten) the zip is given up."""
        while self._queued and self._queued[0].done():
            self._queued.popleft().result()
        self._queued.append(self._queue.submit(self._add_part, path))

    def _add_part(self, path: Path) -> None:
        if self.abandoned:
            return
        t0 = time.perf_counter()
        summaries = self._parts.summaries(path)
        first = summaries[0]["index"] if summaries else self.next_index
        if [s["index"] for s in summaries] != list(range(first, first + len(summaries))) or first != self.next_index:
            self.abandoned = True  # the files go in abandon(), on the job's thread
            return
        self.add(path, 0, len(summaries), summaries)
        self.next_index += len(summaries)
        self.ms += (time.perf_counter() - t0) * 1e3

    def wait(self) -> None:
        """Until the queued parts are in."""
        while self._queued:
            self._queued.popleft().result()

    def _deflate_pending(self) -> None:
        block = b"\n".join(self._pending) + b"\n"
        self._pending, self._pending_size = [], 0
        self._crc, self._size = zlib.crc32(block, self._crc), self._size + len(block)
        if len(self._window) >= 2 * self._threads:
            self._spool.write(self._window.popleft().result())
        self._window.append(self._pool.submit(_deflate, block))

    def finish(self) -> Path:
        """results.jsonl and summary.csv appended; renamed to results.zip."""
        try:
            self.wait()
            if self._pending:
                self._deflate_pending()
            while self._window:
                self._spool.write(self._window.popleft().result())
            self._spool.write(_END)
            zf, fp = self._zf, self._zf.fp
            assert fp is not None
            info = zipfile.ZipInfo("results.jsonl", time.localtime()[:6])
            info.compress_type, info.external_attr = zipfile.ZIP_DEFLATED, 0o600 << 16
            info.CRC, info.file_size, info.compress_size = self._crc, self._size, self._spool.tell()
            info.header_offset = zf.start_dir
            fp.seek(zf.start_dir)
            fp.write(info.FileHeader())
            self._spool.seek(0)
            shutil.copyfileobj(self._spool, fp, 1 << 20)
            zf.filelist.append(info)
            zf.NameToInfo[info.filename] = info
            zf.start_dir = fp.tell()
            zf.writestr("summary.csv", self._csv.getvalue(), compress_type=zipfile.ZIP_DEFLATED,
                        compresslevel=DEFLATE_LEVEL)  # fmt: skip
            zf.close()
            os.replace(self.path, self.jd / "results.zip")
            self.finished = True
            return self.jd / "results.zip"
        except BaseException:
            self.abandon()
            raise
        finally:
            self._close()

    def complete(self, total: int) -> bool:
        """Whether add_part's parts held every item of a job of `total` items, in order."""
        self.wait()
        return not self.abandoned and self.next_index == total

    def abandon(self) -> None:
        """Stop; its files are removed (build_results_zip builds results.zip from the parts)."""
        if self.finished:
            return
        self.abandoned = True
        self._close()
        self.path.unlink(missing_ok=True)

    def _close(self) -> None:
        self._queue.shutdown(wait=True, cancel_futures=True)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._window.clear()
        self._parts.close()
        self._zf.close()
        self._spool.close()
        Path(self._spool.name).unlink(missing_ok=True)


def build_results_zip(jd: Path) -> Path:
    """results.zip from the parts: one row per recorded item, the last part's where an item was
    written twice."""
    found = read_parts(jd)
    order = sorted(found)
    out = ResultsZip(jd)
    try:
        at = 0
        for path, start, stop in runs(found, order):
            out.add(path, start, stop, [found[i][2] for i in order[at : at + stop - start]])
            at += stop - start
    except BaseException:
        out.abandon()
        raise
    return out.finish()
