"""results.zip: a batch job's parts gathered in index order, one row per recorded item.

results.parquet (each part's rows one row group, also kept beside the zip), summary.csv, the
overlays (copied from the parts as they are stored) and, when asked (ARRCOC_RESULTS_JSONL),
results.jsonl derived from results.parquet at the end. Built from the parts once every item is
recorded (`build_results_zip`), or, when a job runs as one chunk from its start, as its parts are
written (`ResultsZip.add_part`): then finishing it is all that is left.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
import zipfile
from pathlib import Path

import pyarrow as pa

from .parts import contiguous, copy_pictures, overlay_names, part_table, read_parts, runs
from .results import JSONL_NAME, RESULTS_NAME, SUMMARY_NAME, ResultsWriter, parquet_to_jsonl, write_summary

DEFLATE_LEVEL = 1


class ResultsZip:
    """results.zip being written: runs of the parts' rows added in index order, then finished."""

    def __init__(self, jd: Path, jsonl: bool = False):
        self.jd = jd
        self.jsonl = jsonl
        tag = secrets.token_hex(4)
        self.path = jd / f".results.{tag}.zip"
        self._parquet = ResultsWriter(jd / f".results.{tag}.parquet")
        self._summary = open(jd / f".summary.{tag}.csv", "w+b")  # noqa: SIM115 -- closed in _close
        self._zf = zipfile.ZipFile(self.path, "w", zipfile.ZIP_STORED)
        self.next_index = 0  # add_part: the index the next part must begin with
        self.abandoned = self.finished = False
        self.ms = 0.0  # the time add_part's parts took

    def add(self, path: Path, rows: pa.Table) -> None:
        """Rows of a part (a run of its rows, in index order): pictures copied, rows appended."""
        copy_pictures(path, overlay_names(rows), self._zf)
        self._parquet.add(rows)
        write_summary(rows, self._summary, header=self._summary.tell() == 0)

    def add_part(self, path: Path, rows: pa.Table | None = None) -> None:
        """A part just written, whole (`rows`: its rows, when the caller has them): added if its
        rows are the next ones in index order; otherwise (items failed apart, a part rewritten)
        the zip is given up."""
        if self.abandoned:
            return
        t0 = time.perf_counter()
        rows = part_table(path) if rows is None else rows
        index = rows["index"].to_numpy()
        if not contiguous(index, self.next_index):
            self.abandon()
            return
        self.add(path, rows)
        self.next_index += len(index)
        self.ms += (time.perf_counter() - t0) * 1e3

    def finish(self) -> Path:
        """results.parquet, summary.csv (and results.jsonl) appended; renamed to results.zip."""
        try:
            self._parquet.close()
            zf = self._zf
            zf.write(self._parquet.path, RESULTS_NAME)  # stored: Parquet's pages are compressed already
            if self._summary.tell() == 0:
                write_summary(pa.table({"index": pa.array([], pa.int32())}), self._summary, header=True)
            self._summary.seek(0)
            with zf.open(zipfile.ZipInfo(SUMMARY_NAME, time.localtime()[:6]), "w") as out:
                shutil.copyfileobj(self._summary, out, 1 << 20)
            if self.jsonl:
                info = zipfile.ZipInfo(JSONL_NAME, time.localtime()[:6])
                info.compress_type = zipfile.ZIP_DEFLATED
                with zf.open(info, "w") as out:
                    parquet_to_jsonl(self._parquet.path, out)
            zf.close()
            os.replace(self._parquet.path, self.jd / RESULTS_NAME)
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
        return not self.abandoned and self.next_index == total

    def abandon(self) -> None:
        """Stop; its files are removed (build_results_zip builds results.zip from the parts)."""
        if self.finished:
            return
        self.abandoned = True
        self._close()
        self.path.unlink(missing_ok=True)

    def _close(self) -> None:
        self._zf.close()
        if not self._summary.closed:
            self._summary.close()
            Path(self._summary.name).unlink(missing_ok=True)
        if not self.finished:
            self._parquet.discard()


def build_results_zip(jd: Path, jsonl: bool = False) -> Path:
    """results.zip from the parts: one row per written item, the last part's where an item was
    written twice; each run of one part's rows one row group."""
    found = read_parts(jd)
    order = sorted(found)
    out = ResultsZip(jd, jsonl)
    try:
        for path, start, stop in runs(found, order):
            out.add(path, part_table(path).slice(start, stop - start))
    except BaseException:
        out.abandon()
        raise
    return out.finish()


__all__ = ["ResultsZip", "build_results_zip"]
