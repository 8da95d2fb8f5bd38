"""The demo's temporary files: the folder it serves copies from, the uploads it counts against the
disk budget, and the reaper that sweeps both.

Expired jobs' files and this demo's temp files older than ARRCOC_JOBS__TEMP_MAX_AGE_S are removed on a
schedule (Gradio's own cache is swept by Blocks(delete_cache=...)). Every upload reserves its
declared length in the data store's disk budget (a folder `upload-<id>` beside the jobs, holding
the reservation and the paths Gradio gave the files): it is counted like a job's files until its
files are swept, after ARRCOC_JOBS__TEMP_MAX_AGE_S, or after TIGHT_UPLOAD_AGE_S while the disk is tight."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path

from arrcoc.service.jobs import budget
from arrcoc.service.jobs.files import Reaper, sweep_old_files
from arrcoc.settings import Settings, get_settings
from arrcoc.tuning import TIGHT_UPLOAD_AGE_S

TEMP_ROOT = Path(tempfile.gettempdir()) / "arrcoc-demo"
UPLOAD_PREFIX = "upload-"
UPLOAD_FILES = "files.json"
_lock = threading.Lock()
_housekeeper: Reaper | None = None


def served(name: str) -> Path:
    """A folder under the demo's own temp folder: one per name, so a poll of a finished job reuses
    the file its first poll made instead of leaving a new copy."""
    folder = TEMP_ROOT / name
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)  # in use: the sweep goes by age
    return folder


def _root(settings: Settings) -> Path:
    return Path(settings.service.data_dir) / "jobs"  # the budget counts what lies here


def reserve_upload(nbytes: int, owner: str, address: str) -> Path:
    """Reserve an upload's `nbytes` against the disk budget (the client's share by `owner` and
    `address`, as a job's), old uploads swept first while the disk is tight; the reservation's
    folder, or InvalidInputError naming the limit."""
    s = get_settings()
    sweep_uploads(s)
    folder = _root(s) / f"{UPLOAD_PREFIX}{secrets.token_hex(8)}"
    budget.reserve(s, folder, owner, nbytes, paid_by=budget.payer(owner, address))
    return folder


def record_upload(folder: Path, paths: list[str]) -> None:
    """The files Gradio wrote for the upload, swept with its reservation."""
    (folder / UPLOAD_FILES).write_text(json.dumps(paths))


def drop_upload(folder: Path) -> None:
    """A refused or failed upload: its reservation goes (Gradio removes what it wrote)."""
    shutil.rmtree(folder, ignore_errors=True)


def disk_tight(settings: Settings) -> bool:
    """Whether half the data store's budget is reserved."""
    total, _ = budget.usage(_root(settings), "")
    return bool(settings.limits.max_data_bytes) and 2 * total >= settings.limits.max_data_bytes


def sweep_uploads(settings: Settings | None = None, now: float | None = None) -> int:
    """Remove uploads (their files in Gradio's cache and their reservation) older than
    ARRCOC_JOBS__TEMP_MAX_AGE_S, or TIGHT_UPLOAD_AGE_S while the disk is tight; returns how many."""
    s = settings or get_settings()
    root, now = _root(s), now or time.time()
    max_age = TIGHT_UPLOAD_AGE_S if disk_tight(s) else s.jobs.temp_max_age_s
    removed = 0
    for folder in root.glob(f"{UPLOAD_PREFIX}*") if root.is_dir() else ():
        try:
            if _age(folder, now) < (
                max_age if (folder / budget.RESERVED).exists() else s.jobs.temp_max_age_s
            ):
                continue  # young, or being reserved
        except OSError:
            continue  # removed meanwhile
        _remove_files(folder / UPLOAD_FILES)
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


def _age(folder: Path, now: float) -> float:
    """Seconds since the upload was reserved (its folder's own time before that)."""
    reserved = folder / budget.RESERVED
    return now - (reserved if reserved.exists() else folder).stat().st_mtime


def _remove_files(listing: Path) -> None:
    """Delete the uploaded files a listing names (only inside Gradio's cache) and their folders."""
    from gradio.utils import get_upload_folder, is_in_or_equal

    try:
        paths = [Path(p) for p in json.loads(listing.read_text()) if isinstance(p, str)]
    except (OSError, ValueError, TypeError):
        return
    cache = get_upload_folder()
    for path in paths:
        if not is_in_or_equal(path, cache) or path == Path(cache):
            continue
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()  # Gradio gives each upload a folder named by its hash
        except OSError:
            pass


def start_housekeeping() -> Reaper:
    """Once per process: a reaper thread for expired jobs, old temp files and old uploads."""
    global _housekeeper
    with _lock:
        if _housekeeper is None:
            s = get_settings()
            sweeps = [lambda: sweep_old_files(TEMP_ROOT, s.jobs.temp_max_age_s), sweep_uploads]
            _housekeeper = Reaper(s, sweeps).start()
        return _housekeeper
