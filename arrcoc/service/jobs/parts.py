"""Part files: a batch job's results as its pipeline writes them, one file per step.

A part (`results/<time>-<rand>.part.zip`, stored) holds one step's rows as a one-row-group
Parquet file (`rows.parquet`, arrcoc.service.jobs.results) and its overlays under their names in
results.zip, so that building results.zip copies the pictures as they are and appends the rows
as a row group (arrcoc.service.jobs.results_zip). A part is written whole (to a temporary name,
then renamed) before its items are recorded; an item written twice (its first worker died before
recording it) is read from the later part.
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

import numpy as np
import pyarrow as pa

from .results import ItemKey, from_bytes, step_table, to_bytes

PART_SUFFIX = ".part.zip"
ROWS = "rows.parquet"

# what recording a step takes: (index, None when it succeeded, else its error message)
Mark = tuple[int, str | None]


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


def write_part(jd: Path, keys: Sequence[ItemKey], outputs, errors: Sequence[str | None],
               overlays: Sequence[bytes | None], ext: str) -> tuple[Path, list[Mark], pa.Table]:  # fmt: skip
    """A step's results (`outputs`: StepOutputs over `keys`' items; `overlays` encoded, `ext`
    their extension, "" for none) as a part; its path, what to record of its items and its rows."""
    names = [zip_name(key[0], key[1], ext) if ext and data is not None and ok else None
             for key, data, ok in zip(keys, overlays, outputs.ok, strict=True)]  # fmt: skip
    table = step_table(keys, outputs, errors, names)
    name = f"{time.time_ns():020d}-{secrets.token_hex(3)}{PART_SUFFIX}"  # later parts win (see read_parts)
    tmp = jd / "results" / f".{name}.tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        for member, data in zip(names, overlays, strict=True):
            if member is not None:
                zf.writestr(member, data)
        zf.writestr(ROWS, to_bytes(table))
    os.replace(tmp, jd / "results" / name)
    marks = [(key[0], None if ok else (err or "The item failed.")) for key, ok, err in zip(keys, outputs.ok, errors, strict=True)]
    return jd / "results" / name, marks, table


def part_table(path: Path, columns: list[str] | None = None) -> pa.Table:
    with zipfile.ZipFile(path) as zf:
        return from_bytes(zf.read(ROWS), columns)


# -- reading parts back ---------------------------------------------------------------------------
def read_parts(jd: Path) -> dict[int, tuple[Path, int]]:
    """index -> (part, row) of every written row. Parts are read oldest first, so an item written
    again (its first worker died before recording it) keeps its last row: the one the job store
    recorded."""
    found: dict[int, tuple[Path, int]] = {}
    for path in sorted((jd / "results").glob(f"*{PART_SUFFIX}")) if (jd / "results").is_dir() else ():
        index = part_table(path, ["index"])["index"].to_numpy()
        found.update({int(i): (path, row) for row, i in enumerate(index)})
    return found


def runs(found: dict[int, tuple[Path, int]], order: list[int]) -> Iterator[tuple[Path, int, int]]:
    """(part, start, stop): the rows in index order as runs of consecutive rows of one part."""
    run: list | None = None
    for i in order:
        path, row = found[i]
        if run is not None and run[0] == path and run[2] == row:
            run[2] += 1
            continue
        if run is not None:
            yield run[0], run[1], run[2]
        run = [path, row, row + 1]
    if run is not None:
        yield run[0], run[1], run[2]


def copy_pictures(path: Path, members: list[str], out: zipfile.ZipFile) -> None:
    """Copy the part's `members` into `out` as they are stored: consecutive ones in one read and
    one write of their bytes, local headers and CRCs included (no CRC pass, no per-member write);
    others one by one."""
    if not members:
        return
    with zipfile.ZipFile(path) as zf:
        infos = sorted(zf.infolist(), key=lambda i: i.header_offset)
        first = next((k for k, i in enumerate(infos) if i.filename == members[0]), None)
        run = infos[first : first + len(members)] if first is not None else []
        if [i.filename for i in run] != members or any(i.flag_bits & 0x08 for i in run) or zf.fp is None:
            for m in members:
                out.writestr(m, zf.read(m), compress_type=zipfile.ZIP_STORED)
            return
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


def overlay_names(table: pa.Table) -> list[str]:
    """The overlays a run of rows names, in row order."""
    return [n for n in table["overlay"].to_pylist() if n is not None]


def contiguous(index: np.ndarray, first: int) -> bool:
    """Whether `index` is first, first + 1, ... (a part that continues the results in order)."""
    return bool(len(index) == 0 or (index[0] == first and np.array_equal(index, np.arange(first, first + len(index)))))
