"""results.zip: a batch job's parts gathered in index order, one row per recorded item.

results.parquet (each part's rows one row group; stored in the zip only), summary.csv, the
overlays and, when asked (ARRCOC_JOBS__RESULTS_JSONL), results.jsonl derived from results.parquet at
the end. Built from the parts once every item is recorded (`build_results_zip`: the pictures
copied from where the parts say they are, as they are stored), or, when a job runs as one chunk
from its start, as its steps are written: each step's pictures straight into it
(`ResultsZip.add_pictures`, the part naming where they are), its rows once they are recorded
(`ResultsZip.add_rows`); then finishing it is all that is left, and each picture is on disk once.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from ...tuning import COPY_PIECE
from .parts import (
    Pictures,
    append_pictures,
    contiguous,
    copy_pictures,
    overlay_names,
    read_parts,
    runs,
)
from .results import (
    JSONL_NAME,
    RESULTS_NAME,
    SUMMARY_NAME,
    ResultsWriter,
    parquet_to_jsonl,
    summary_lines,
    write_summary,
)


class ResultsZip:
    """results.zip being written: runs of the parts' rows added in index order, then finished."""

    def __init__(self, jd: Path, jsonl: bool = False):
        self.jd = jd
        self.jsonl = jsonl
        tag = secrets.token_hex(4)
        # in results/ beside the parts: once it holds pictures that parts name, it stays there
        # (results.zip is a second name for it), so that results.zip can be built again from the parts
        (jd / "results").mkdir(exist_ok=True)
        self.file = f"results/{time.time_ns():020d}-{tag}.results.zip"
        self.path = jd / self.file
        self._parquet = ResultsWriter(jd / f".results.{tag}.parquet")
        self._summary = open(jd / f".summary.{tag}.csv", "w+b")  # noqa: SIM115 -- closed in _close
        self._zf = zipfile.ZipFile(self.path, "w", zipfile.ZIP_STORED)
        self.next_index = 0  # the index the next rows must begin with, when written as the job runs
        self.abandoned = self.finished = False
        self.holds_pictures = False  # pictures that parts name: the file outlives this object
        self.ms = 0.0  # the time the steps' pictures and rows took

    def add(self, pictures: Pictures, rows: pa.Table) -> None:
        """A run of a part's rows, in index order, and where the part's pictures are: the rows'
        pictures copied, the rows appended."""
        t0 = time.perf_counter()
        copy_pictures(self.jd, pictures, overlay_names(rows), self._zf)
        self._add_rows(rows)
        self.next_index += rows.num_rows
        self.ms += (time.perf_counter() - t0) * 1e3

    def _add_rows(self, rows: pa.Table, summary: bytes | None = None) -> None:
        """`rows` appended (a row group) with their summary.csv lines (`summary`: made already)."""
        self._parquet.add(rows)
        if self._summary.tell() == 0:
            self._summary.write(summary_lines(rows.slice(0, 0), header=True))
        self._summary.write(summary_lines(rows) if summary is None else summary)

    def add_pictures(
        self, index: Sequence[int], names: Sequence[str | None], datas: Sequence[bytes | None]
    ) -> Pictures | None:
        """A step's pictures (its items `index`, each picture's name or None), written here and
        nowhere else, when the step continues the results in index order; where they are, for its
        part to name. None, and the zip given up, when it does not (items failed apart, a step
        written again): the part holds its pictures then."""
        if self.abandoned:
            return None
        if not contiguous(np.asarray(index), self.next_index):
            self.abandon()
            return None
        t0 = time.perf_counter()
        have = [(n, d) for n, d in zip(names, datas, strict=True) if n is not None]
        self.holds_pictures = self.holds_pictures or bool(have)
        stored = append_pictures(self._zf, self.file, [n for n, _ in have], [d for _, d in have])
        self.ms += (time.perf_counter() - t0) * 1e3
        return stored

    def add_rows(self, rows: pa.Table, summary: bytes | None = None) -> None:
        """The rows of the step whose pictures `add_pictures` took, once they are recorded, and
        their summary.csv lines when they are made already (results.summary_lines)."""
        if self.abandoned:
            return
        t0 = time.perf_counter()
        self._add_rows(rows, summary)
        self.next_index += rows.num_rows
        self.ms += (time.perf_counter() - t0) * 1e3

    def finish(self) -> Path:
        """results.parquet, summary.csv (and results.jsonl) appended; renamed to results.zip."""
        try:
            self._parquet.close()
            zf = self._zf
            with open(self._parquet.path, "rb") as rows:  # stored: Parquet's pages are compressed already
                _store(zf, RESULTS_NAME, rows)
            if self._summary.tell() == 0:
                write_summary(pa.table({"index": pa.array([], pa.int32())}), self._summary, header=True)
            self._summary.seek(0)
            _store(zf, SUMMARY_NAME, self._summary)
            if self.jsonl:
                info = zipfile.ZipInfo(JSONL_NAME, time.localtime()[:6])
                info.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(info, "w") as out:
                    parquet_to_jsonl(self._parquet.path, out)
            zf.close()
            self._parquet.path.unlink()
            if self.holds_pictures:  # parts name this file: results.zip is a second name for it
                tmp = self.jd / f".results.{secrets.token_hex(4)}.zip"
                try:
                    os.link(self.path, tmp)
                except OSError:  # a filesystem without hard links: a copy
                    shutil.copyfile(self.path, tmp)
                os.replace(tmp, self.jd / "results.zip")
            else:
                os.replace(self.path, self.jd / "results.zip")
            self.finished = True
            return self.jd / "results.zip"
        except BaseException:
            self.abandon()
            raise
        finally:
            self._close()

    def complete(self, total: int) -> bool:
        """Whether the steps added held every item of a job of `total` items, in order."""
        return not self.abandoned and self.next_index == total

    def abandon(self) -> None:
        """Stop; its files are removed (build_results_zip builds results.zip from the parts), but
        for pictures that parts name: they stay, as a zip of them."""
        if self.finished or self.abandoned:
            return
        self.abandoned = True
        self._close()
        if not self.holds_pictures:
            self.path.unlink(missing_ok=True)

    def _close(self) -> None:
        self._zf.close()
        if not self._summary.closed:
            self._summary.close()
            Path(self._summary.name).unlink(missing_ok=True)
        if not self.finished:
            self._parquet.discard()


def _store(zf: zipfile.ZipFile, name: str, src: BinaryIO) -> None:
    """`src`, from where it stands to its end, as the stored entry `name` of `zf`, copied in large
    pieces (COPY_PIECE); its size decides whether the entry needs ZIP64."""
    info = zipfile.ZipInfo(name, time.localtime()[:6])
    info.file_size = os.fstat(src.fileno()).st_size - src.tell()
    with zf.open(info, "w") as out:
        shutil.copyfileobj(src, out, COPY_PIECE)


def build_results_zip(jd: Path, jsonl: bool = False) -> Path:
    """results.zip from the parts: one row per written item, the last part's where an item was
    written twice; each run of one part's rows one row group."""
    found = read_parts(jd)
    order = sorted(found)
    out = ResultsZip(jd, jsonl)
    try:
        for part, start, stop in runs(found, order):
            out.add(part.pictures, part.rows.slice(start, stop - start))
    except BaseException:
        out.abandon()
        raise
    return out.finish()


__all__ = ["ResultsZip", "build_results_zip"]
