"""Batch job input: a zip of images (+ optional manifest) checked and unpacked into the data store.

Refused with a message that says what to fix: not a zip, too large, a likely zip bomb, unsafe
or duplicate names (every one named), no images, too many items, a manifest that is not UTF-8,
names files the zip lacks or has rows without a valid query. The zip is inspected from its
central directory before anything is decompressed; extraction then streams to disk against a
running byte budget, so the sizes the zip declares are never trusted. Entries stored uncompressed
are read in place from the archive, written once, their CRCs checked meanwhile.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import re
import shutil
import struct
import unicodedata
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
from PIL import Image

from ...errors import InvalidInputError, ServiceUnavailableError
from ...images import draft_size, jpeg_header
from ...request import validate_query
from ...settings import Settings
from ...tuning import CENTRAL_BYTES_PER_ENTRY, HEADER_READ_BYTES, PACK_ITEMS
from .budget import RESERVED, disk_full, outputs_estimate, reserve
from .parts import stored_data_start

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
MANIFEST_NAMES = ("manifest.csv", "manifest.jsonl")


@dataclass(frozen=True)
class Item:
    index: int
    file: str  # name inside the zip
    query: str
    path: str  # the file holding its bytes (a pack, or the archive), relative to the job dir
    offset: int = 0
    length: int = -1  # -1: to the end of the file
    # the CRC the zip declares for an entry read in place from the archive, checked when it is read
    # (in the batch pipeline's step threads, not serially at submission); None: checked while copied
    crc: int | None = None

    def to_json(self) -> dict:
        doc = {
            "index": self.index,
            "file": self.file,
            "query": self.query,
            "path": self.path,
            "offset": self.offset,
            "length": self.length,
        }
        return doc | ({"crc": self.crc} if self.crc is not None else {})

    def read(self, job_dir: Path, opened: dict[str, Any]) -> bytes:
        """Its bytes; `opened` keeps the packs a caller reads from open (a step's items share one).
        CorruptEntry when they are not what the zip declared."""
        f = opened.get(self.path)
        if f is None:
            f = opened[self.path] = open(job_dir / self.path, "rb")  # noqa: SIM115 -- closed by the caller
        f.seek(self.offset)
        return self.checked(f.read(self.length))

    def checked(self, data: bytes) -> bytes:
        """`data`, its bytes, once they match the CRC the zip declares (CorruptEntry if not)."""
        if self.crc is not None and zlib.crc32(data) != self.crc:
            raise CorruptEntry(
                f"The zip entry {self.file!r} is corrupt (its checksum does not match); rebuild the zip."
            )
        return data


class CorruptEntry(OSError):
    """An item's stored bytes do not match the zip's CRC: that item fails, its neighbours run."""


# Entries stored as they are (photos mostly: deflate does not shrink a JPEG, so zip tools store
# them) are not copied at all: the archive is written once, as ARCHIVE, and such an item is read
# at its offset there, its CRC checked when the batch pipeline reads it (an entry that does not
# match fails its item alone). Copying them one by one through zipfile would be most of what is left of unpacking, a
# serial stage before the job runs (docs/service.md#batch-jobs).
ARCHIVE = "inputs/upload.zip"


# a Windows drive (`c:`, `c:/x.png`): absolute there. A colon elsewhere is an ordinary character: an
# entry's name is only a label (inputs are stored by index, overlays under ASCII names of their own)
_DRIVE = re.compile(r"^[A-Za-z]:")


def _clean(name: str) -> str | None:
    """The entry's normalised relative name, or None when it is unsafe (absolute, `..`, drive)."""
    clean = name.replace("\\", "/")
    parts = clean.split("/")
    if clean.startswith("/") or ".." in parts or _DRIVE.match(clean) or "\x00" in clean:
        return None
    return posixpath.normpath(clean)


# Bidirectional formatting characters (Unicode's explicit embeddings, overrides and isolates, and the
# marks): in a name they reorder what every page, log and spreadsheet shows (`gnp.exe` shown as
# `exe.png`), as they would in a query.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def odd_character(name: str) -> str | None:
    """What makes a file name unfit to show, in words (None: nothing): a control character, a lone
    surrogate (not valid UTF-8) or a bidirectional formatting character."""
    if name.isascii() and name.isprintable():  # the usual name: no control character, nothing else odd
        return None
    for ch in name:
        if ch in _BIDI:
            return f"a bidirectional formatting character (U+{ord(ch):04X})"
        category = unicodedata.category(ch)
        if category == "Cc":
            return f"a control character (U+{ord(ch):04X})"
        if category == "Cs":
            return "a lone surrogate (not valid UTF-8)"
    return None


def _is_junk(name: str) -> bool:
    """A folder or an OS's litter (__MACOSX/, dot files); judged on the name with backslashes as
    separators, so that `..\\..\\x.jpg` is an unsafe path, reported, not a dot file dropped."""
    name = name.replace("\\", "/")
    base = name.rpartition("/")[2]
    return name.startswith("__MACOSX/") or (base.startswith(".") and base not in (".", "..")) or not base


# The end-of-central-directory record (EOCD) and the zip64 locator and record, as PKWARE's
# APPNOTE lays them out: read before zipfile parses anything, so that the count of entries and the
# central directory's size are refused on what the archive declares, before a ZipInfo is built.
_EOCD = struct.Struct("<4sHHHHIIH")
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")


def declared_directory(archive: bytes | memoryview) -> tuple[int, int] | None:
    """(entries, central directory bytes) as the archive's end records declare them (zip64 when
    the classic record says so); None when there is no end record (not a zip)."""
    tail_from = max(0, len(archive) - (_EOCD.size + 0xFFFF))
    at = bytes(archive[tail_from:]).rfind(b"PK\x05\x06")
    if at < 0 or tail_from + at + _EOCD.size > len(archive):
        return None
    at += tail_from
    _, _, _, _, entries, cd_size, _, _ = _EOCD.unpack_from(archive, at)
    if (entries == 0xFFFF or cd_size == 0xFFFFFFFF) and at >= _ZIP64_LOCATOR.size:
        sig, _, rec_at, _ = _ZIP64_LOCATOR.unpack_from(archive, at - _ZIP64_LOCATOR.size)
        if sig == b"PK\x06\x07" and 0 <= rec_at <= len(archive) - _ZIP64_EOCD.size:
            rec = _ZIP64_EOCD.unpack_from(archive, rec_at)
            if rec[0] == b"PK\x06\x06":
                entries, cd_size = rec[7], rec[8]
    return entries, cd_size


def open_archive(archive: bytes, settings: Settings) -> zipfile.ZipFile:
    if not archive:
        raise InvalidInputError("The uploaded file is empty; upload a .zip of images.")
    if len(archive) > settings.limits.max_archive_bytes:
        raise InvalidInputError(
            f"The zip is {len(archive) / 1e6:.0f} MB; the limit is {settings.limits.max_archive_bytes / 1e6:.0f} MB."
            " Split it into several jobs."
        )
    declared = declared_directory(archive)
    if declared is not None:  # none: zipfile says what is wrong below
        entries, cd_size = declared
        if entries > settings.limits.max_archive_entries:
            raise InvalidInputError(
                f"The zip has {entries} entries; the limit is {settings.limits.max_archive_entries}."
                " Split it into several jobs."
            )
        if cd_size > settings.limits.max_archive_entries * CENTRAL_BYTES_PER_ENTRY:
            raise InvalidInputError(
                f"The zip's list of entries (its central directory) is {cd_size / 1e6:.1f} MB; the limit is"
                f" {settings.limits.max_archive_entries * CENTRAL_BYTES_PER_ENTRY / 1e6:.1f} MB (names of about"
                f" {CENTRAL_BYTES_PER_ENTRY} bytes for each of {settings.limits.max_archive_entries} entries)."
                " Use shorter names or split the job."
            )
    try:
        zf = zipfile.ZipFile(io.BytesIO(archive))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise InvalidInputError(f"This is not a readable .zip archive ({e}); upload a .zip of images.") from e
    except NotImplementedError as e:  # unsupported compression method
        raise InvalidInputError(f"The zip uses an unsupported compression method ({e}); use deflate.") from e
    return zf


def _listing(names: list[str], limit: int = 5) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(repr(n) for n in names[:limit]) + more


def inspect(zf: zipfile.ZipFile, settings: Settings) -> dict[str, zipfile.ZipInfo]:
    """Check the zip from its central directory, before a byte is decompressed: entry count,
    unsafe and duplicate names, each entry's size and expansion ratio, and the total it expands
    to. Every problem of a kind is named, never dropped. Returns {clean name: entry} of the files
    (folders and junk such as __MACOSX/ and dot files left out)."""
    infos = zf.infolist()
    if len(infos) > settings.limits.max_archive_entries:
        raise InvalidInputError(
            f"The zip has {len(infos)} entries; the limit is {settings.limits.max_archive_entries}."
            " Split it into several jobs."
        )
    files = [i for i in infos if not i.is_dir() and not _is_junk(i.filename)]
    cleaned = [_clean(i.filename) for i in files]
    unsafe = [i.filename for i, name in zip(files, cleaned, strict=True) if name is None]
    if unsafe:
        raise InvalidInputError(
            f"Some zip entries have unsafe paths (absolute or with '..'): {_listing(unsafe)};"
            " rebuild the zip with plain relative names."
        )
    odd = [(i.filename, why) for i in files if (why := odd_character(i.filename))]
    if odd:
        raise InvalidInputError(
            f"Some zip entries have names holding {odd[0][1]} or the like:"
            f" {', '.join(ascii(n) for n, _ in odd[:5])}{f' and {len(odd) - 5} more' if len(odd) > 5 else ''};"
            " rename them with plain characters."
        )
    by_name: dict[str, zipfile.ZipInfo] = {}
    dups: list[str] = []
    for info, name in zip(files, cleaned, strict=True):
        if name in by_name:  # a second entry of the same name would silently replace the first
            dups.append(name)
        by_name[name] = info
    if dups:
        raise InvalidInputError(
            f"The zip holds several entries named {_listing(sorted(set(dups)))}; each item"
            " needs its own name. Rename them and upload again."
        )
    encrypted = [i.filename for i in files if i.flag_bits & 0x1]
    if encrypted:
        raise InvalidInputError(
            f"Some zip entries are encrypted: {_listing(encrypted)}; upload an unencrypted zip."
        )
    # a manifest is text (repetitive, compresses well): it is bounded by its own size limit instead
    manifests = {i.filename for i in files if posixpath.basename(i.filename).lower() in MANIFEST_NAMES}
    bombs = [
        i
        for i in files
        if i.filename not in manifests
        and i.file_size > 4096
        and i.file_size > settings.limits.max_archive_ratio * max(i.compress_size, 1)
    ]
    if bombs:
        worst = max(bombs, key=lambda i: i.file_size / max(i.compress_size, 1))
        raise InvalidInputError(
            f"{len(bombs)} zip entries expand more than {settings.limits.max_archive_ratio}x (the worst, {worst.filename!r},"
            f" {worst.file_size / max(worst.compress_size, 1):.0f}x to {worst.file_size / 1e6:.1f} MB): this looks"
            " like a zip bomb and was refused."
        )
    big = [
        i.filename
        for i in files
        if i.filename not in manifests and i.file_size > settings.limits.max_image_bytes
    ]
    if big:
        raise InvalidInputError(
            f"Some zip entries are larger than {settings.limits.max_image_bytes / 1e6:.0f} MB:"
            f" {_listing(big)}. Downscale those images."
        )
    long = [n for n in manifests if zf.getinfo(n).file_size > settings.limits.max_manifest_bytes]
    if long:
        raise InvalidInputError(
            f"The manifest {long[0]!r} is larger than {settings.limits.max_manifest_bytes / 1e6:.0f} MB;"
            " split the job."
        )
    total = sum(i.file_size for i in files)
    if total > settings.limits.max_unpacked_bytes:
        raise InvalidInputError(
            f"The zip expands to {total / 1e9:.2f} GB; the limit is"
            f" {settings.limits.max_unpacked_bytes / 1e9:.2f} GB. Split it into several jobs."
        )
    return by_name


class _Budget:
    """Bytes still allowed on disk for this job: counted while writing, whatever the zip declares."""

    def __init__(self, total: int):
        self.left = total

    def copy(self, src, dst, name: str, limit: int) -> int:
        written = 0
        while chunk := src.read(1024 * 1024):
            written += len(chunk)
            self.left -= len(chunk)
            if written > limit or self.left < 0:
                raise InvalidInputError(
                    f"The zip entry {name!r} expands past what the zip declares; refused"
                    " (a corrupt or hostile zip)."
                )
            dst.write(chunk)
        return written


def _not_utf8(name: str, byte: int, offset: int) -> InvalidInputError:
    return InvalidInputError(
        f"{name} is not UTF-8 text (byte 0x{byte:02x} at offset {offset} is not valid UTF-8);"
        " save it as UTF-8 (e.g. 'CSV UTF-8' in a spreadsheet) and upload again."
    )


def decode_manifest(raw: bytes, name: str) -> str:
    """The manifest's text: UTF-8 (a BOM is fine), or a clear error, never U+FFFD in a query."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _not_utf8(name, raw[e.start], e.start) from None


def parse_manifest(
    raw: str, name: str, default_query: str | None, max_query_chars: int, max_items: int | None = None
) -> list[tuple[str, str]]:
    """Rows (file, query) of a manifest's text (see manifest_rows). `max_query_chars` is kept for
    callers; queries are checked per item when they run."""
    return manifest_rows(io.StringIO(raw, newline=""), name, default_query, max_items)


def _records(lines: Iterable[str], name: str) -> Iterator[object]:
    """A manifest's records, a line at a time: CSV with a file,query header, or JSONL."""
    if name.endswith(".jsonl"):
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except (json.JSONDecodeError, RecursionError) as e:
                    raise InvalidInputError(
                        f"{name} line {n} is not JSON ({e}); write one object per line."
                    ) from None
        return
    reader = csv.DictReader(lines)
    try:
        if not reader.fieldnames or "file" not in reader.fieldnames:
            raise InvalidInputError(f"{name} needs a header row with the columns file,query.")
        yield from reader
    except csv.Error as e:
        raise InvalidInputError(
            f"{name} line {reader.line_num} cannot be read as CSV ({e}); a field may be"
            f" too long (the limit is {csv.field_size_limit()} characters)."
        ) from None


def manifest_rows(
    lines: Iterable[str], name: str, default_query: str | None, max_items: int | None = None
) -> list[tuple[str, str]]:
    """Rows (file, query) of a manifest read a line at a time (CSV with a file,query header, or
    JSONL); files and queries must be text. Reading stops at the row past `max_items`, so a
    manifest of a million rows costs what its first rows do."""
    out = []
    for n, row in enumerate(_records(lines, name), 1):
        if max_items is not None and n > max_items:
            raise InvalidInputError(
                f"{name} lists more than {max_items} items; the limit is {max_items} per job. Split it into several jobs."
            )
        out.append(_manifest_row(row, n, name, default_query))
    if not out:
        raise InvalidInputError(f"{name} lists no files.")
    return out


def _manifest_row(row: object, n: int, name: str, default_query: str | None) -> tuple[str, str]:
    if not isinstance(row, dict):
        raise InvalidInputError(f"{name} row {n} is not an object with file and query.")
    file, query = row.get("file"), row.get("query")
    if not isinstance(file, str) or not file.strip():
        raise InvalidInputError(f"{name} row {n} has no 'file' (a text value).")
    if why := odd_character(file):  # no zip entry is named so
        raise InvalidInputError(
            f"{name} row {n}: the file name {ascii(file.strip())} holds {why}; name the file as the zip does."
        )
    if query is None or (isinstance(query, str) and not query.strip()):
        if not default_query:
            raise InvalidInputError(
                f"{name} row {n} ({file.strip()!r}) has no query, and no default query was given."
            )
        query = default_query
    if not isinstance(query, str):  # a number or a list is not turned into text
        raise InvalidInputError(
            f"{name} row {n} ({file.strip()!r}): the query must be text, got {type(query).__name__}."
        )
    if any(unicodedata.category(ch) == "Cs" for ch in query):  # not text the tokenizer (or a row) can hold
        raise InvalidInputError(
            f"{name} row {n} ({file.strip()!r}): the query {ascii(query)} holds a lone surrogate,"
            " which is not valid UTF-8 text; fix the manifest."
        )
    # a query the model refuses (too long, control characters) fails its item only, with the reason
    return file.strip(), query.strip()


class _Counted(io.RawIOBase):
    """A stream that counts the bytes read from it (where a decoding error is, in the whole file)."""

    def __init__(self, src: IO[bytes]):
        self.src, self.read_bytes = src, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self.src.read(len(buf))
        buf[: len(data)] = data
        self.read_bytes += len(data)
        return len(data)


def _read_manifest(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, default_query: str | None, settings: Settings
) -> list[tuple[str, str]]:
    """The manifest's rows, decompressed and decoded a piece at a time (zipfile stops at the size
    the central directory declares, which `inspect` bounded): never the whole text in memory."""
    name = info.filename
    counted = None
    try:
        with zf.open(info) as src:
            counted = _Counted(src)
            text = io.TextIOWrapper(io.BufferedReader(counted), encoding="utf-8-sig", newline="")
            return manifest_rows(text, name, default_query, settings.limits.max_batch_items)
    except UnicodeDecodeError as e:  # the decoder holds the piece read last
        offset = counted.read_bytes - len(e.object) + e.start if counted else e.start
        raise _not_utf8(name, e.object[e.start], max(offset, 0)) from None
    except InvalidInputError:
        raise
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError, zlib.error) as e:
        raise InvalidInputError(
            f"The zip entry {name!r} is corrupt or encrypted ({e}); rebuild the zip."
        ) from e


def _stored_span(view: memoryview, info: zipfile.ZipInfo) -> tuple[int, int] | None:
    """(offset, length) in the archive of a stored entry's bytes, read from its local header;
    None for an entry that is compressed or whose local header disagrees (those are copied
    through zipfile, which says what is wrong)."""
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        return None
    start = stored_data_start(view, info.header_offset)
    if start is None:
        return None
    start += info.header_offset
    return (start, info.file_size) if start + info.file_size <= len(view) else None


def _write_archive(archive: bytes | memoryview, path: Path) -> None:
    path.write_bytes(archive)


class PendingArchive:
    """A job's archive (ARCHIVE) while it is in memory, not yet on disk. In-process a job starts at
    once and its steps read their items from here; the archive goes to disk only when the job
    waits for a turn (`write_all`), so a job that runs in one turn never writes it, nor reads it
    back. One thread at a time writes it: the submitter's while the job waits to be queued, then
    the job thread's between turns, when no step of the job runs."""

    def __init__(self, archive: bytes, path: Path):
        self.data: memoryview | None = memoryview(archive)
        self.path = path

    def read(self, item: Item) -> bytes | None:
        """`item`'s bytes from memory, checked; None when they are on disk."""
        data = self.data  # read once: the check and the slice see the same value
        if data is None or item.path != ARCHIVE:
            return None
        return item.checked(bytes(data[item.offset : item.offset + item.length]))

    def write_all(self) -> None:
        """The archive on disk, and out of memory."""
        if self.data is not None:
            _write_archive(self.data, self.path)
            self.data = None

    def drop(self) -> None:
        """The job is over: the archive leaves memory, unwritten."""
        self.data = None


def unpack(
    archive: bytes,
    query: str | None,
    job_dir: Path,
    settings: Settings,
    owner: str | None = None,
    paid_by: str | None = None,
    pictures: bool = True,
    write_archive: bool = True,
) -> list[Item]:
    """Check the zip, write its items under job_dir/inputs and job_dir/items.jsonl; return them.
    `write_archive` False: the archive, which stored entries are read from in place, is left for
    the caller to write (PendingArchive), its disk reserved already.
    Stored entries stay where they are in the archive, written once (ARCHIVE); compressed ones
    are decompressed into packs. Disk: at most the archive plus its declared expansion, both
    bounded by the settings, and its results (`pictures`: whether the job draws overlays),
    reserved for `owner` before writing, counted against `paid_by` (budget.payer; None: the
    owner)."""
    zf = open_archive(archive, settings)
    by_name = inspect(zf, settings)
    if query is not None and not (isinstance(query, str) and not query.strip()):
        query = validate_query(query, settings.limits.max_query_chars)
    else:
        query = None
    pairs, skipped, why = _items_of(zf, by_name, query, settings)
    view = memoryview(archive)
    spans: dict[str, tuple[int, int, int]] = {}  # stored entries, read in place: offset, length, CRC
    for name in dict.fromkeys(name for name, _ in pairs):  # once each
        info = by_name[name]
        if (span := _stored_span(view, info)) is not None:
            spans[name] = (*span, info.CRC)
    sizes = _check_work(zf, view, by_name, spans, pairs, settings)
    # what the job may write, reserved before a byte is written: the archive (when entries are read
    # in place from it), each decompressed file at its declared size (extraction stops there), results
    unique = dict.fromkeys(name for name, _ in pairs)
    need = (
        (len(archive) if spans else 0)
        + sum(min(by_name[n].file_size, settings.limits.max_image_bytes) for n in unique if n not in spans)
        + outputs_estimate((sizes[name] for name, _ in pairs), settings, pictures)
    )
    reserve(settings, job_dir, owner, need, paid_by)
    try:
        items = _extract(archive, zf, view, by_name, spans, pairs, job_dir, settings, write_archive)
        with open(job_dir / "items.jsonl", "wb") as f:
            f.writelines(orjson.dumps(it.to_json()) + b"\n" for it in items)
        if skipped:  # said in the job's status, never dropped silently
            (job_dir / SKIPPED).write_text(json.dumps({"files": skipped, "why": why}))
    except BaseException as e:  # nothing of a refused job is kept, its reservation included
        shutil.rmtree(job_dir / "inputs", ignore_errors=True)
        for name in (RESERVED, SKIPPED, "items.jsonl"):
            (job_dir / name).unlink(missing_ok=True)
        if disk_full(e):
            raise ServiceUnavailableError(
                "The service's disk is full; the job was not accepted and nothing of it"
                " was kept. Try again later."
            ) from e
        raise
    return items


def _items_of(
    zf: zipfile.ZipFile, by_name: dict[str, zipfile.ZipInfo], query: str | None, settings: Settings
) -> tuple[list[tuple[str, str]], list[str], str]:
    """The job's (file, query) pairs, from the manifest or every image with `query`; the zip's
    files that are no item, and why."""
    manifests = sorted(n for n in by_name if posixpath.basename(n).lower() in MANIFEST_NAMES)
    if len(manifests) > 1:
        raise InvalidInputError(
            f"The zip holds {len(manifests)} manifests ({_listing(manifests)}); keep one."
        )
    if manifests:
        pairs = _read_manifest(zf, by_name[manifests[0]], query, settings)
        pairs = [(_clean(f) or f, q) for f, q in pairs]  # as the zip's entries are named in by_name
        missing = [f for f, _ in pairs if f not in by_name]
        if missing:
            raise InvalidInputError(
                f"The manifest names files the zip lacks: {', '.join(missing[:5])}"
                + (f" and {len(missing) - 5} more." if len(missing) > 5 else ".")
            )
    else:
        if not query:
            raise InvalidInputError(
                "Give a query for all images, or put a manifest.csv (file,query) in the zip."
            )
        names = sorted(n for n in by_name if posixpath.splitext(n)[1].lower() in IMAGE_EXTENSIONS)
        pairs = [(n, query) for n in names]
    if not pairs:
        raise InvalidInputError(
            f"The zip holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}); add some and upload again."
        )
    if len(pairs) > settings.limits.max_batch_items:
        raise InvalidInputError(
            f"The zip has {len(pairs)} items; the limit is {settings.limits.max_batch_items} per job."
        )
    named = {name for name, _ in pairs} | set(manifests)
    skipped = sorted(n for n in by_name if n not in named)
    why = (
        "not named in the manifest" if manifests else f"not an image ({', '.join(sorted(IMAGE_EXTENSIONS))})"
    )
    return pairs, skipped, why


def _extract(
    archive: bytes,
    zf: zipfile.ZipFile,
    view: memoryview,
    by_name: dict[str, zipfile.ZipInfo],
    spans: dict[str, tuple[int, int, int]],
    pairs: list[tuple[str, str]],
    job_dir: Path,
    settings: Settings,
    write_archive: bool = True,
) -> list[Item]:
    """The items' bytes written under job_dir/inputs: stored ones in place in the archive (written
    once, here unless `write_archive` is False), compressed ones into packs, one copy per file."""
    (job_dir / "inputs").mkdir(parents=True, exist_ok=True)
    if (
        spans and write_archive
    ):  # written as it came; each stored entry's CRC is checked when its item is read
        _write_archive(archive, job_dir / ARCHIVE)
    budget = _Budget(settings.limits.max_unpacked_bytes)
    # one copy per file, however many manifest rows name it
    written: dict[str, tuple[str, int, int, int | None]] = {
        name: (ARCHIVE, start, length, crc) for name, (start, length, crc) in spans.items()
    }
    items = []
    pack, packed, rel = None, 0, ""
    try:
        for index, (name, q) in enumerate(pairs):
            where = written.get(name)
            if where is None:
                if pack is None or packed == PACK_ITEMS:
                    if pack is not None:
                        pack.close()
                    rel = f"inputs/{index:05d}.pack"
                    pack, packed = open(job_dir / rel, "wb"), 0  # noqa: SIM115 -- closed below
                info = by_name[name]
                offset = pack.tell()
                try:
                    with zf.open(info) as src:
                        length = budget.copy(
                            src, pack, name, min(info.file_size, settings.limits.max_image_bytes)
                        )
                except (
                    zipfile.BadZipFile,
                    OSError,
                    EOFError,
                    NotImplementedError,
                    RuntimeError,
                    zlib.error,
                ) as e:
                    if disk_full(e):  # our disk, not the zip: said as such by the caller
                        raise
                    raise InvalidInputError(
                        f"The zip entry {name!r} is corrupt or encrypted ({e}); rebuild the zip."
                    ) from e
                where = written[name] = (rel, offset, length, None)  # zipfile checked its CRC
                packed += 1
            items.append(Item(index, name, q, *where))
    finally:
        if pack is not None:
            pack.close()
    return items


def _decoded_size(head: bytes | memoryview, side: int) -> tuple[int, int] | None:
    """(width, height) an image is decoded at, from its header: a JPEG at the reduced size its
    decoder's draft gives for `side`, anything else at full size; None when the header cannot be
    read (the item then fails alone, or decodes within the per-image pixel limit)."""
    jpeg = jpeg_header(head)
    if jpeg is not None:  # a plain JPEG: its frame header, without Pillow's parse of every table
        return draft_size(jpeg.size, side)
    try:
        with Image.open(io.BytesIO(head)) as img:
            if img.format == "JPEG":
                img.draft(img.mode if img.mode in ("RGB", "L") else None, (side, side))
            return img.size
    except Exception:  # noqa: BLE001 -- any header Pillow cannot read costs the limit
        return None


def _check_work(
    zf: zipfile.ZipFile,
    view: memoryview,
    by_name: dict[str, zipfile.ZipInfo],
    spans: dict[str, tuple[int, int, int]],
    pairs: list[tuple[str, str]],
    settings: Settings,
) -> dict[str, tuple[int, int]]:
    """Refuse a job whose items' decoded pixels, summed, pass ARRCOC_LIMITS__MAX_JOB_MEGAPIXELS (one large
    image named by many manifest rows counts once a row), from the headers alone. Returns each
    file's decoded (width, height); one whose header cannot be read counts as the pixel limit, and
    as a picture of the largest overlay."""
    side = settings.jobs.overlay_max_side
    sizes: dict[str, tuple[int, int] | None] = {}
    for name in dict.fromkeys(name for name, _ in pairs):
        if name in spans:
            start, length, _ = spans[name]
            head: bytes | memoryview = view[start : start + min(length, HEADER_READ_BYTES)]
        else:
            try:
                with zf.open(by_name[name]) as src:
                    head = src.read(HEADER_READ_BYTES)
            except Exception:  # noqa: BLE001 -- a broken entry is refused when it is extracted
                head = b""
        sizes[name] = _decoded_size(head, side)
    pixels = {n: size[0] * size[1] if size else settings.limits.max_image_pixels for n, size in sizes.items()}
    total = sum(pixels[name] for name, _ in pairs) / 1e6
    if total > settings.limits.max_job_megapixels:
        raise InvalidInputError(
            f"The job is {total:,.0f} megapixels of decoding ({len(pairs)} items); the limit is"
            f" {settings.limits.max_job_megapixels:,.0f} (ARRCOC_LIMITS__MAX_JOB_MEGAPIXELS). Split it into smaller jobs"
            " or downscale the images."
        )
    return {n: size or (side, side) for n, size in sizes.items()}


SKIPPED = "skipped.json"  # the zip's files that are no item, and why


def skipped_note(job_dir: Path) -> str:
    """What the zip held that is no item, in words ("" when nothing was skipped)."""
    try:
        doc = json.loads((job_dir / SKIPPED).read_text())
    except (OSError, ValueError):
        return ""
    files = doc.get("files") or []
    if not files:
        return ""
    noun = "file" if len(files) == 1 else "files"
    return f"Skipped {len(files)} {noun} of the zip, {doc.get('why', '')}: {_listing(files)}."


def load_items(job_dir: Path, start: int = 0, stop: int | None = None) -> list[Item]:
    """The job's items [start, stop): only their lines parsed (a chunk's, of a job of any size)."""
    lines = (job_dir / "items.jsonl").read_bytes().splitlines()
    return [Item(**orjson.loads(line)) for line in lines[start:stop] if line.strip()]
