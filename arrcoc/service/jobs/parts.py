"""Part files: a batch job's results as its pipeline writes them, one file per step.

A part (`results/<time>-<rand>.part.zip`, stored) holds one step's items: `index.jsonl` per item
its summary (summary.csv's fields, read back without parsing the row), `rows.jsonl` its
results.jsonl line, and its overlay under its name in results.zip, so that building results.zip
copies the pictures as they are (arrcoc.service.jobs.results_zip). One file per step, not two per
item: creating files is what writing cost (cProfile on the 2-core dev machine: 0.5 ms an open).
A part is written whole (to a temporary name, then renamed) before its items are recorded.

This module is light (numpy, orjson; no torch): the part writer's child process imports it.
"""

from __future__ import annotations

import copy
import os
import re
import secrets
import struct
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

if TYPE_CHECKING:
    from ..host.interface import Processed

PART_SUFFIX = ".part.zip"

# what a part writer needs of an item: (index, file name in the zip, query)
ItemKey = tuple[int, str, str]
# what recording a step takes: (index, None when it succeeded, else its error message)
Mark = tuple[int, str | None]


class WrittenStep(NamedTuple):
    marks: list[Mark]  # what to record of its items
    ms: float  # what writing it took
    part: Path


def item_row(key: ItemKey, ok: bool, error: str | None = None) -> dict[str, Any]:
    index, file, query = key
    return {"index": index, "file": file, "query": query, "ok": ok, "error": error}


def zip_name(index: int, file: str, ext: str) -> str:
    """An overlay's name in its part and in results.zip."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(file).stem)[:80]
    return f"overlays/{index:05d}_{stem}{ext}"


def stored_data_start(header: bytes | memoryview, at: int = 0) -> int | None:
    """Where a stored zip member's bytes begin, from its local header at `at` in `header` (an
    offset from `at`: the header's fixed part, the name and the extra field, which may differ from
    the central directory's); None when that is not a stored member's local header."""
    if at < 0 or at + zipfile.sizeFileHeader > len(header):
        return None
    head = struct.unpack_from(zipfile.structFileHeader, header, at)
    if head[zipfile._FH_SIGNATURE] != zipfile.stringFileHeader or head[zipfile._FH_COMPRESSION_METHOD] != zipfile.ZIP_STORED:
        return None
    return zipfile.sizeFileHeader + head[zipfile._FH_FILENAME_LENGTH] + head[zipfile._FH_EXTRA_FIELD_LENGTH]


def write_part(jd: Path, entries: list[tuple[dict[str, Any], bytes | None, str]]) -> Path:
    """entries: (row, overlay bytes or None, overlay extension) per item, in index order; the
    part's path."""
    name = f"{time.time_ns():020d}-{secrets.token_hex(3)}{PART_SUFFIX}"  # later parts win (see read_parts)
    tmp = jd / "results" / f".{name}.tmp"
    index, rows = [], []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for row, picture, ext in entries:
            member = None
            if picture is not None:
                member = zip_name(row["index"], row["file"], ext)
                zf.writestr(member, picture)
            index.append(orjson.dumps(summary_row(row, member)))
            rows.append(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY))
        zf.writestr("index.jsonl", b"\n".join(index))
        zf.writestr("rows.jsonl", b"\n".join(rows))
    os.replace(tmp, jd / "results" / name)
    return jd / "results" / name


def write_step(jd: Path, keys: Sequence[ItemKey], items: Sequence[Processed], ext: str) -> WrittenStep:
    """One engine-host call's items as a part (`ext`: the overlays', "" for none)."""
    t0 = time.perf_counter()
    entries: list[tuple[dict[str, Any], bytes | None, str]] = []
    marks: list[Mark] = []
    for key, got in zip(keys, items, strict=True):
        if got.result is None:
            message = (got.error or {}).get("message", "The item failed.")
            entries.append((item_row(key, False, message), None, ""))
            marks.append((key[0], message))
        else:
            row = item_row(key, True) | {"result": got.result.to_json(numpy_arrays=True)}
            entries.append((row, got.overlay if ext else None, ext))
            marks.append((key[0], None))
    part = write_part(jd, entries)
    return WrittenStep(marks, (time.perf_counter() - t0) * 1e3, part)


# the most relevant cell as its row and column of the grid (a flat index means nothing to a reader)
SUMMARY_FIELDS = ("index", "file", "query", "status", "error", "overlay", "k", "tokens_used", "match_score", "weak_match",
                  "top_row", "top_col", "weight_information", "weight_perspectival", "weight_participatory", "backend",
                  "bucket")  # fmt: skip


def summary_row(row: dict[str, Any], overlay: str | None) -> dict[str, Any]:
    """summary.csv's fields of a row; `overlay` is the picture's name in its part and in results.zip."""
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


# -- reading parts back ---------------------------------------------------------------------------
def read_parts(jd: Path) -> dict[int, tuple[Path, int, dict[str, Any]]]:
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


class PartReader:
    """The parts a results.zip is built from, a few open at a time (their items come mostly in
    index order, part after part): bounded file handles and memory on a job of any size."""

    KEEP = 4

    def __init__(self) -> None:
        self._open: dict[Path, tuple[zipfile.ZipFile, bytes | None, list[bytes] | None]] = {}
        self._by_offset: dict[Path, list[zipfile.ZipInfo]] = {}
        self._lines: dict[Path, int] = {}  # rows in a part whose index was read (a line per row)

    def _get(self, path: Path) -> tuple[zipfile.ZipFile, bytes | None, list[bytes] | None]:
        if path not in self._open:
            if len(self._open) >= self.KEEP:
                gone = next(iter(self._open))
                self._open.pop(gone)[0].close()
                self._by_offset.pop(gone, None)
            self._open[path] = (zipfile.ZipFile(path), None, None)
        return self._open[path]

    def copy_pictures(self, path: Path, members: list[str], out: zipfile.ZipFile) -> bool:
        """Copy the part's consecutive `members` into `out` as they are stored: one read and one
        write of their bytes, local headers and CRCs included, no CRC pass or per-member write
        (what building results.zip cost). False, and nothing written, when they cannot be (not
        consecutive, or written with data descriptors: zipfile never does that to a file)."""
        zf = self._get(path)[0]
        infos = self._by_offset.get(path)
        if infos is None:
            infos = self._by_offset[path] = sorted(zf.infolist(), key=lambda i: i.header_offset)
        first = next((k for k, i in enumerate(infos) if i.filename == members[0]), None)
        run = infos[first : first + len(members)] if first is not None else []
        if [i.filename for i in run] != members or any(i.flag_bits & 0x08 for i in run) or zf.fp is None:
            return False
        begin = run[0].header_offset
        end = infos[first + len(run)].header_offset if first + len(run) < len(infos) else zf.start_dir
        zf.fp.seek(begin)
        data = zf.fp.read(end - begin)
        out.fp.seek(out.start_dir)  # where zipfile writes its next member
        for info in run:  # the central directory's entries, pointing into `out`
            moved = copy.copy(info)
            moved.header_offset = out.start_dir + info.header_offset - begin
            out.filelist.append(moved)
            out.NameToInfo[moved.filename] = moved
        out.fp.write(data)
        out.start_dir = out.fp.tell()
        return True

    def summaries(self, path: Path) -> list[dict[str, Any]]:
        """The part's index.jsonl: its items' summaries, in line order."""
        out = [orjson.loads(line) for line in self._get(path)[0].read("index.jsonl").splitlines()]
        self._lines[path] = len(out)
        return out

    def picture(self, path: Path, member: str) -> bytes:
        """The member's bytes read straight from the part, without zipfile's CRC pass (a CRC per
        overlay was a third of building results.zip on the H100 host; results.zip's own CRC,
        computed as it is written, still covers them)."""
        zf = self._get(path)[0]
        info = zf.getinfo(member)
        if info.compress_type != zipfile.ZIP_STORED or zf.fp is None:
            return zf.read(member)
        zf.fp.seek(info.header_offset)
        start = stored_data_start(zf.fp.read(zipfile.sizeFileHeader))
        if start is None:
            return zf.read(member)
        zf.fp.seek(info.header_offset + start)
        return zf.fp.read(info.compress_size)

    def rows(self, path: Path, start: int, stop: int) -> bytes:
        """Lines [start, stop) of the part's rows.jsonl, joined by newlines: the whole file as it
        is when they are all its lines (the common case: splitting it cost more than deflating;
        counted from its index when that was read, else in the blob)."""
        zf, blob, lines = self._get(path)
        if blob is None:
            blob = zf.read("rows.jsonl")
        total = self._lines.get(path)
        if start == 0 and stop == (total if total is not None else blob.count(b"\n") + 1):
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
        self._by_offset.clear()
        self._lines.clear()


def runs(found: dict[int, tuple[Path, int, dict[str, Any]]], order: list[int]) -> Iterator[tuple[Path, int, int]]:
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


