"""The data store's disk budget: what batch jobs may hold on disk, in all and per payer.

A job reserves, before a byte of it is written, all it may write: the upload when its stored
entries are read in place, every entry it decompresses at the size the central directory
declares (extraction stops at that size: `archive._Budget`, and at most the image limit), and
its results: a row an item and, when it draws pictures, an overlay bounded by its photo's size
(`outputs_estimate`). A queued job holds its reservation until it is over, so a job admitted
always has room to finish: when the disk is spoken for, the newcomer is refused, and no running
job loses items to another's. The reservation is a file in the job's folder (`reserved.json`:
owner, payer, bytes), so the budget is the sum over the folders that exist: a job the reaper
removed frees its share, whichever process made it. The per-user share is counted by payer
(`payer`): a token holder, or the network an anonymous client comes from, however many sessions
it opens. Reserving is a check-and-write under a lock (a thread lock and an advisory file lock,
for the processes that share the data store). Once a job is over, its inputs go (nothing reads
them again) and its reservation becomes what its folder holds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import shutil
import socket
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from ...errors import InvalidInputError
from ...settings import Settings
from ...tuning import PICTURE_BYTES_PER_PIXEL, PICTURE_HEADER_BYTES, ROW_BYTES
from .atomic import atomic_write

RESERVED = "reserved.json"
# What an item's row and overlay picture may take (the estimates: arrcoc.tuning): the picture is
# drawn on the photo as decoded, at most `jobs.overlay_max_side` a side (never enlarged), its sides
# rounded up to JPEG's 16-pixel blocks.
PICTURE_BLOCK = 16
# An item's row and picture are written twice: in the step's part, then copied into results.zip when
# results.zip is built from the parts (once when it is written as the job runs). The estimate only
# reserves: once the job is over, what its folder holds replaces it.
OUTPUT_COPIES = 2

_lock = threading.Lock()
# reservations read from the folders, by folder name (a reservation is rewritten only by
# `release`, which updates this too); a folder that is gone is dropped at the next scan
_known: dict[str, tuple[int, str, int]] = {}  # name: (reservation's mtime, payer, bytes)


def disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def picture_bytes(size: tuple[int, int], side: int) -> int:
    """The most an overlay of a photo decoded at `size` (width, height) may take, drawn at most
    `side` a side."""
    w, h = (-(-min(n, side) // PICTURE_BLOCK) * PICTURE_BLOCK for n in size)
    return PICTURE_BYTES_PER_PIXEL * w * h + PICTURE_HEADER_BYTES


def outputs_estimate(sizes: Iterable[tuple[int, int]], settings: Settings, pictures: bool = True) -> int:
    """What a job's items may write as results: each item's row and, when the job draws pictures,
    its overlay, whose size follows its photo's (`sizes`: each item's decoded (width, height), as
    its header says). A tiny photo named by many manifest rows reserves a row each and a tiny
    picture each, not a large photo's."""
    side = settings.jobs.overlay_max_side
    return OUTPUT_COPIES * sum(ROW_BYTES + (picture_bytes(size, side) if pictures else 0) for size in sizes)


def payer(owner: str | None, address: str | None) -> str | None:
    """Whose share of the disk a job counts against: a token holder's own (`token:...`); an
    anonymous owner's (a browser or a session, which a client makes anew for free) that of the
    network it comes from: its IPv4 address, or its IPv6 /64 (what one host is usually given).
    Without an address (the CLI, a library caller), the owner's."""
    if not address or (owner or "").startswith("token:"):
        return owner
    try:
        ip = ipaddress.ip_address(address.strip())
    except ValueError:
        return owner
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is None:
            return f"address:{ipaddress.ip_network(f'{ip}/64', strict=False)}"
        ip = ip.ipv4_mapped
    return f"address:{ip}"


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with _lock, open(root / ".budget.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(folder: Path) -> tuple[str, int]:
    try:
        mtime = (folder / RESERVED).stat().st_mtime_ns
        known = _known.get(folder.name)
        if known is None or known[0] != mtime:  # new, or released by another process
            doc = json.loads((folder / RESERVED).read_text())
            who = doc.get("payer", doc.get("owner", ""))  # made before payers: its owner pays
            known = _known[folder.name] = (mtime, str(who), int(doc.get("bytes", 0)))
    except (OSError, ValueError, TypeError):
        return "", 0  # not reserved yet (being created) or made before budgets: counted as nothing
    return known[1], known[2]


def usage(root: Path, paid_by: str) -> tuple[int, int]:
    """(bytes reserved by every job, by the jobs `paid_by` pays for) under `root` (<data_dir>/jobs)."""
    total = mine = 0
    names = set()
    for folder in root.iterdir() if root.is_dir() else ():
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        names.add(folder.name)
        who, n = _read(folder)
        total += n
        mine += n if who == paid_by else 0
    for gone in set(_known) - names:
        _known.pop(gone, None)
    return total, mine


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def reserve(
    settings: Settings, job_dir: Path, owner: str | None, nbytes: int, paid_by: str | None = None
) -> None:
    """Reserve `nbytes` for the job in `job_dir` (owner None: the anonymous owner), counted against
    `paid_by`'s share (see `payer`; None: the owner's), or refuse it in words naming the limit it
    would pass. A job admitted has room for all it may write: the next one is refused instead."""
    owner = owner or ""
    paid_by = paid_by or owner
    root = job_dir.parent
    with _locked(root):
        total, mine = usage(root, paid_by)
        if settings.limits.max_data_bytes and total + nbytes > settings.limits.max_data_bytes:
            raise InvalidInputError(
                f"The service's disk for batch jobs is full: this job needs up to {_gb(nbytes)} and"
                f" {_gb(max(0, settings.limits.max_data_bytes - total))} of {_gb(settings.limits.max_data_bytes)} are free"
                " (ARRCOC_LIMITS__MAX_DATA_BYTES). Try again when older jobs have expired, or submit a smaller job."
            )
        if settings.limits.max_owner_bytes and mine + nbytes > settings.limits.max_owner_bytes:
            raise InvalidInputError(
                f"Your batch jobs hold {_gb(mine)} of the {_gb(settings.limits.max_owner_bytes)} each user may use"
                f" (ARRCOC_LIMITS__MAX_OWNER_BYTES); this job needs up to {_gb(nbytes)}. Fetch and wait for your"
                " earlier jobs to expire, or submit a smaller job."
            )
        job_dir.mkdir(parents=True, exist_ok=True)
        # the creating process, by host and pid: a job held in its memory is unreachable once it is gone
        doc = {
            "owner": owner,
            "payer": paid_by,
            "bytes": nbytes,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        _write(job_dir, doc)


def _write(job_dir: Path, doc: dict) -> None:
    """The reservation replaced whole: a reader never sees it half written, which would count the
    job as holding nothing."""
    atomic_write(job_dir / RESERVED, json.dumps(doc).encode())


def folder_bytes(path: Path) -> int:
    """What a job's folder holds, its reservation left out; a file under two names (results.zip
    and the file its pictures were written into) counted once."""
    seen: dict[tuple[int, int], int] = {}
    for f in path.rglob("*") if path.exists() else ():
        if f.is_file() and f.name != RESERVED:
            st = f.stat()
            seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def release(job_dir: Path) -> None:
    """A job that is over: its inputs removed (nothing reads them again) and its reservation set
    to what its folder holds now."""
    shutil.rmtree(job_dir / "inputs", ignore_errors=True)
    with contextlib.suppress(OSError, ValueError):
        with _locked(job_dir.parent):
            doc = json.loads((job_dir / RESERVED).read_text())
            doc["bytes"] = folder_bytes(job_dir)
            _write(job_dir, doc)


def creator_gone(job_dir: Path) -> bool:
    """Whether the process that made the job (on this host) has ended; False when unknown."""
    try:
        doc = json.loads((job_dir / RESERVED).read_text())
        if doc.get("host") != socket.gethostname():
            return False
        os.kill(int(doc["pid"]), 0)
    except ProcessLookupError:
        return True
    except (OSError, ValueError, TypeError, KeyError):
        return False
    return False
