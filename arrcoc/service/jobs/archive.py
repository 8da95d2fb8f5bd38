"""Batch job input: a zip of images (+ optional manifest) checked and unpacked into the data store.

Refused with a message that says what to fix: not a zip, too large, a likely zip bomb, unsafe
names (absolute, `..`, drive letters), no images, too many items, a manifest naming files the
zip lacks or rows without a query. Bytes are never trusted to match the sizes the zip declares.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import InvalidInputError
from ...settings import Settings

IMAGE_EXTENSIONS = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
MANIFEST_NAMES = ("manifest.csv", "manifest.jsonl")


@dataclass(frozen=True)
class Item:
    index: int
    file: str  # name inside the zip
    query: str
    path: str  # relative to the job dir

    def to_json(self) -> dict:
        return {"index": self.index, "file": self.file, "query": self.query, "path": self.path}


def _safe_name(name: str) -> str:
    clean = name.replace("\\", "/")
    parts = clean.split("/")
    if clean.startswith("/") or ".." in parts or (parts and ":" in parts[0]):
        raise InvalidInputError(
            f"The zip entry {name!r} has an unsafe path (absolute or with '..'); rebuild the zip with"
            " plain relative names."
        )
    return posixpath.normpath(clean)


def _is_junk(name: str) -> bool:
    base = posixpath.basename(name)
    return name.startswith("__MACOSX/") or base.startswith(".") or not base


def _open(archive: bytes, settings: Settings) -> zipfile.ZipFile:
    if not archive:
        raise InvalidInputError("The uploaded file is empty; upload a .zip of images.")
    if len(archive) > settings.max_archive_bytes:
        raise InvalidInputError(
            f"The zip is {len(archive) / 1e6:.0f} MB; the limit is {settings.max_archive_bytes / 1e6:.0f} MB."
            " Split it into several jobs."
        )
    try:
        zf = zipfile.ZipFile(io.BytesIO(archive))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise InvalidInputError(f"This is not a readable zip archive ({e}); upload a .zip of images.") from e
    except NotImplementedError as e:  # unsupported compression method
        raise InvalidInputError(f"The zip uses an unsupported compression method ({e}); use deflate.") from e
    return zf


def _check_sizes(infos: list[zipfile.ZipInfo], settings: Settings) -> None:
    total = 0
    for info in infos:
        total += info.file_size
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > 1024 * 1024 and ratio > settings.max_archive_ratio:
            raise InvalidInputError(
                f"The zip entry {info.filename!r} expands {ratio:.0f}x (to {info.file_size / 1e6:.0f} MB):"
                " this looks like a zip bomb and was refused."
            )
    limit = settings.max_batch_items * settings.max_image_bytes
    if total > limit:
        raise InvalidInputError(f"The zip expands to {total / 1e9:.1f} GB; the limit is {limit / 1e9:.1f} GB.")


def _read_manifest(zf: zipfile.ZipFile, name: str, default_query: str | None) -> list[tuple[str, str]]:
    raw = zf.open(name).read(16 * 1024 * 1024).decode("utf-8-sig", errors="replace")
    rows: list[dict] = []
    if name.endswith(".jsonl"):
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise InvalidInputError(f"{name} line {n} is not JSON ({e}); write one object per line.") from e
    else:
        reader = csv.DictReader(io.StringIO(raw))
        if not reader.fieldnames or "file" not in reader.fieldnames:
            raise InvalidInputError(f"{name} needs a header row with the columns file,query.")
        rows = list(reader)
    out = []
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict) or not str(row.get("file") or "").strip():
            raise InvalidInputError(f"{name} row {n} has no 'file'.")
        query = str(row.get("query") or "").strip() or (default_query or "")
        if not query:
            raise InvalidInputError(f"{name} row {n} ({row['file']}) has no query, and no default query was given.")
        out.append((str(row["file"]).strip(), query))
    if not out:
        raise InvalidInputError(f"{name} lists no files.")
    return out


def unpack(archive: bytes, query: str | None, job_dir: Path, settings: Settings) -> list[Item]:
    """Check the zip, write its items under job_dir/inputs and job_dir/items.jsonl; return them."""
    zf = _open(archive, settings)
    infos = [i for i in zf.infolist() if not i.is_dir() and not _is_junk(i.filename)]
    by_name = {_safe_name(i.filename): i for i in infos}  # raises on unsafe names
    _check_sizes(infos, settings)
    manifest = next((n for n in by_name if posixpath.basename(n).lower() in MANIFEST_NAMES), None)
    if manifest is not None:
        pairs = _read_manifest(zf, manifest, query)
        missing = [f for f, _ in pairs if posixpath.normpath(f.replace("\\", "/")) not in by_name]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise InvalidInputError(f"The manifest names files the zip lacks: {', '.join(missing[:5])}{more}.")
    else:
        if not query or not query.strip():
            raise InvalidInputError("Give a query for all images, or put a manifest.csv (file,query) in the zip.")
        names = sorted(n for n in by_name if posixpath.splitext(n)[1].lower() in IMAGE_EXTENSIONS)
        pairs = [(n, query.strip()) for n in names]
    if not pairs:
        raise InvalidInputError(
            f"The zip holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))}); add some and upload again."
        )
    if len(pairs) > settings.max_batch_items:
        raise InvalidInputError(f"The zip has {len(pairs)} items; the limit is {settings.max_batch_items} per job.")
    inputs = job_dir / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    items = []
    for index, (name, q) in enumerate(pairs):
        name = posixpath.normpath(name.replace("\\", "/"))
        ext = posixpath.splitext(name)[1].lower()[:6] or ".bin"
        rel = f"inputs/{index:05d}{ext}"
        try:
            with zf.open(by_name[name]) as src:
                data = src.read(settings.max_image_bytes + 1)  # never past the limit, whatever the header says
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as e:
            raise InvalidInputError(f"The zip entry {name!r} is corrupt or encrypted ({e}); rebuild the zip.") from e
        (job_dir / rel).write_bytes(data)
        items.append(Item(index, name, q, rel))
    with open(job_dir / "items.jsonl", "w") as f:
        for it in items:
            f.write(json.dumps(it.to_json()) + "\n")
    return items


def load_items(job_dir: Path) -> list[Item]:
    with open(job_dir / "items.jsonl") as f:
        return [Item(**json.loads(line)) for line in f if line.strip()]
