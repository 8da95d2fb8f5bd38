"""Part files: a batch job's results as its pipeline writes them, one file per step.

A part (`results/<time>-<rand>.part.zip`, stored) holds one step's rows as an Arrow IPC file
(`rows.arrow`: the step's arrays as they are, encoded to Parquet once, in results.parquet) and
says where the step's pictures are (`pictures.json`). Each picture is written once, as a stored
zip entry (local header, then its bytes) under its name in results.zip: into the part itself, or,
when the job's results.zip is being written as it runs, straight into that file, the part naming
the byte range. Building results.zip copies such ranges as they are (no CRC pass, no Python copy
of the bytes) and appends the rows as a row group (arrcoc.service.jobs.results_zip). A part is
written whole (to a temporary name, then renamed) after its pictures are on disk and before its
items are recorded; an item written twice (its first worker died before recording it) is read
from the later part.
"""

from __future__ import annotations

import os
import re
import secrets
import struct
import time
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from .results import ItemKey, from_ipc, to_ipc

PART_SUFFIX = ".part.zip"
ROWS = "rows.arrow"
PICTURES = "pictures.json"
COPY_CHUNK = 1 << 22  # bytes a copy moves at once where the kernel cannot copy between files itself

# what recording a step takes: (index, None when it succeeded, else its error message)
Mark = tuple[int, str | None]


def zip_name(index: int, file: str, ext: str) -> str:
    """An overlay's name in its part and in results.zip (ASCII: no zip flag for UTF-8 names)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(file).stem)[:80]
    return f"overlays/{index:05d}_{stem}{ext}"


def picture_names(
    keys: Sequence[ItemKey], overlays: Sequence[bytes | None], ok: np.ndarray, ext: str
) -> list[str | None]:
    """Each item's picture's name in results.zip (None: no picture: failed, or none asked for)."""
    return [
        zip_name(key[0], key[1], ext) if ext and data is not None and good else None
        for key, data, good in zip(keys, overlays, ok, strict=True)
    ]


def stored_data_start(header: bytes | memoryview, at: int = 0) -> int | None:
    """Where a stored zip member's bytes begin, from its local header at `at` in `header` (an
    offset from `at`: the header's fixed part, the name and the extra field, which may differ from
    the central directory's); None when that is not a stored member's local header."""
    if at < 0 or at + zipfile.sizeFileHeader > len(header):
        return None
    head = struct.unpack_from(zipfile.structFileHeader, header, at)
    if (
        head[zipfile._FH_SIGNATURE] != zipfile.stringFileHeader
        or head[zipfile._FH_COMPRESSION_METHOD] != zipfile.ZIP_STORED
    ):
        return None
    return zipfile.sizeFileHeader + head[zipfile._FH_FILENAME_LENGTH] + head[zipfile._FH_EXTRA_FIELD_LENGTH]


# -- pictures: runs of stored zip entries -----------------------------------------------------------
@dataclass(frozen=True)
class Pictures:
    """A step's pictures, in row order, as consecutive stored zip entries of one file (`file`,
    relative to the job's folder): each one's name, local header's offset, CRC and size."""

    file: str
    names: tuple[str, ...]
    offsets: tuple[int, ...]
    crcs: tuple[int, ...]
    sizes: tuple[int, ...]

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "file": self.file,
                "names": self.names,
                "offsets": self.offsets,
                "crcs": self.crcs,
                "sizes": self.sizes,
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> Pictures:
        d = orjson.loads(data)
        return cls(d["file"], *(tuple(d[k]) for k in ("names", "offsets", "crcs", "sizes")))

    def end(self, i: int) -> int:
        """Where entry i ends in `file`."""
        return self.offsets[i] + _header_size(self.names[i]) + self.sizes[i]


def _header_size(name: str) -> int:
    """A local header's size, for an entry written here (no extra field)."""
    return zipfile.sizeFileHeader + len(name.encode())


def _entry(name: str, crc: int, size: int, offset: int, date_time: tuple[int, ...]) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o600 << 16  # as ZipFile.writestr marks a file
    info.CRC, info.compress_size, info.file_size, info.header_offset = crc, size, size, offset
    return info


def _register(out: zipfile.ZipFile, infos: list[zipfile.ZipInfo], end: int) -> None:
    """Entries written into `out` at its end by hand, listed in its central directory."""
    out.filelist.extend(infos)
    out.NameToInfo.update((i.filename, i) for i in infos)
    out.start_dir = end
    out.fp.seek(end)


def append_pictures(
    out: zipfile.ZipFile, file: str, names: Sequence[str], datas: Sequence[bytes]
) -> Pictures:
    """`datas` written at the end of `out` (an open ZipFile being written, at `file` in the job's
    folder) as stored entries under `names`, in one pass: headers packed here, one CRC call per
    picture, no per-entry bookkeeping of zipfile's; on disk (flushed) when this returns."""
    when = time.localtime()[:6]
    at = out.start_dir
    out.fp.seek(at)
    infos, offsets, crcs, sizes = [], [], [], []
    for name, data in zip(names, datas, strict=True):
        info = _entry(name, zlib.crc32(data), len(data), at, when)
        out.fp.write(info.FileHeader(zip64=False))
        out.fp.write(data)
        infos.append(info)
        offsets.append(at)
        crcs.append(info.CRC)
        sizes.append(info.file_size)
        at += _header_size(name) + info.file_size
    out.fp.flush()  # in the kernel before a part names them: a killed process loses none of them
    _register(out, infos, at)
    return Pictures(file, tuple(names), tuple(offsets), tuple(crcs), tuple(sizes))


def copy_pictures(jd: Path, pictures: Pictures, names: Sequence[str], out: zipfile.ZipFile) -> None:
    """The entries `names` (in order, consecutive in `pictures`) copied to the end of `out` as
    they are stored: each run of consecutive entries one kernel-side copy of its bytes, headers
    and CRCs included."""
    if not names:
        return
    where = {n: i for i, n in enumerate(pictures.names)}
    picked = [where[n] for n in names]
    out.fp.flush()
    with open(jd / pictures.file, "rb") as src:
        begin = 0
        while begin < len(picked):
            stop = begin + 1
            while stop < len(picked) and picked[stop] == picked[stop - 1] + 1:
                stop += 1
            first, last = picked[begin], picked[stop - 1]
            at = out.start_dir
            _copy_range(src, pictures.offsets[first], pictures.end(last), out.fp, at)
            shift = at - pictures.offsets[first]
            when = time.localtime()[:6]
            infos = [
                _entry(
                    pictures.names[i], pictures.crcs[i], pictures.sizes[i], pictures.offsets[i] + shift, when
                )
                for i in picked[begin:stop]
            ]
            _register(out, infos, at + pictures.end(last) - pictures.offsets[first])
            begin = stop


def _copy_range(src, begin: int, end: int, dst, at: int) -> None:
    """Bytes [begin, end) of `src` to `dst` at `at`: in the kernel where it can (copy_file_range,
    which shares the blocks on filesystems that can), else through a bounded buffer."""
    n, moved = end - begin, 0
    try:
        while moved < n:
            k = os.copy_file_range(src.fileno(), dst.fileno(), n - moved, begin + moved, at + moved)
            if k == 0:
                raise OSError("short copy")
            moved += k
    except (OSError, AttributeError):
        dst.seek(at + moved)
        while moved < n:
            chunk = os.pread(src.fileno(), min(COPY_CHUNK, n - moved), begin + moved)
            if not chunk:
                raise OSError(f"{src.name} ends before its pictures do") from None
            dst.write(chunk)
            moved += len(chunk)
        dst.flush()


# -- parts ---------------------------------------------------------------------------------------
def step_marks(keys: Sequence[ItemKey], ok: np.ndarray, errors: Sequence[str | None]) -> list[Mark]:
    """What recording a step's items takes: each one's index, and its error where it failed."""
    return [
        (key[0], None if good else (err or "The item failed."))
        for key, good, err in zip(keys, ok, errors, strict=True)
    ]


def write_part(
    jd: Path,
    rows: pa.Table,
    names: Sequence[str | None],
    overlays: Sequence[bytes | None],
    stored: Pictures | None = None,
) -> Path:
    """A step's rows (arrcoc.service.jobs.results.step_table; `names` each row's picture's name,
    None where there is none) as a part: its pictures written into it, unless `stored` says where
    they are already; its path."""
    name = f"{time.time_ns():020d}-{secrets.token_hex(3)}{PART_SUFFIX}"  # later parts win (see read_parts)
    tmp = jd / "results" / f".{name}.tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:
        if stored is None:
            have = [(n, d) for n, d in zip(names, overlays, strict=True) if n is not None]
            stored = append_pictures(zf, f"results/{name}", [n for n, _ in have], [d for _, d in have])
        zf.writestr(ROWS, to_ipc(rows))
        zf.writestr(PICTURES, stored.to_json())
    os.replace(tmp, jd / "results" / name)
    return jd / "results" / name


@dataclass(frozen=True, eq=False)  # one part is one object: runs of rows compare parts by identity
class Part:
    """A part read back: its rows, mapped in place, and where its pictures are."""

    rows: pa.Table
    pictures: Pictures


def read_part(path: Path) -> Part:
    """A part, its directory read once. Its rows are read in place: the stored entry
    memory-mapped, so a run of its rows copies nothing and its index touches only its own pages.
    Parts are this service's own files, written whole and then renamed, so the entry's CRC is not
    computed again on every read."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(ROWS)
        pictures = Pictures.from_json(zf.read(PICTURES))
        if info.compress_type != zipfile.ZIP_STORED:
            return Part(from_ipc(zf.read(info)), pictures)
    mapped = pa.memory_map(str(path))  # its buffers keep the mapping while the table lives
    start = stored_data_start(mapped.read_at(zipfile.sizeFileHeader, info.header_offset))
    if start is None:
        raise zipfile.BadZipFile(f"{path.name}: {ROWS} has no local header where the directory says")
    mapped.seek(info.header_offset + start)
    return Part(from_ipc(mapped.read_buffer(info.file_size)), pictures)  # a view, no copy


# -- reading parts back ---------------------------------------------------------------------------
def read_parts(
    jd: Path, found: dict[int, tuple[Part, int]] | None = None, read: set[str] | None = None
) -> dict[int, tuple[Part, int]]:
    """index -> (part, row) of every written row, added to `found`; parts named in `read` are
    skipped, and those read now are added to it (a caller reading the parts again as they come).
    Parts are read oldest first, so an item written again (its first worker died before recording
    it) keeps its last row: the one the job store recorded."""
    found = {} if found is None else found
    read = set() if read is None else read
    for path in sorted((jd / "results").glob(f"*{PART_SUFFIX}")) if (jd / "results").is_dir() else ():
        if path.name in read:
            continue
        read.add(path.name)
        part = read_part(path)
        index = part.rows["index"].to_numpy()
        found.update({int(i): (part, row) for row, i in enumerate(index)})
    return found


def runs(found: dict[int, tuple[Part, int]], order: list[int]) -> Iterator[tuple[Part, int, int]]:
    """(part, start, stop): the rows in index order as runs of consecutive rows of one part."""
    run: list | None = None
    for i in order:
        part, row = found[i]
        if run is not None and run[0] is part and run[2] == row:
            run[2] += 1
            continue
        if run is not None:
            yield run[0], run[1], run[2]
        run = [part, row, row + 1]
    if run is not None:
        yield run[0], run[1], run[2]


def overlay_names(table: pa.Table) -> list[str]:
    """The overlays a run of rows names, in row order."""
    return [n for n in table["overlay"].to_pylist() if n is not None]


def contiguous(index: np.ndarray, first: int) -> bool:
    """Whether `index` is first, first + 1, ... (a part that continues the results in order)."""
    return bool(
        len(index) == 0 or (index[0] == first and np.array_equal(index, np.arange(first, first + len(index))))
    )
