"""The demo's temporary files: the folder it serves copies from, and the reaper that sweeps it.

Expired jobs' files and this demo's temp files older than ARRCOC_TEMP_MAX_AGE_S are removed on a
schedule (Gradio's own cache is swept by Blocks(delete_cache=...))."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

from arrcoc.service.jobs.files import Reaper, sweep_old_files
from arrcoc.settings import get_settings

TEMP_ROOT = Path(tempfile.gettempdir()) / "arrcoc-demo"
_lock = threading.Lock()
_housekeeper: Reaper | None = None


def served(name: str) -> Path:
    """A folder under the demo's own temp folder: one per name, so a poll of a finished job reuses
    the file its first poll made instead of leaving a new copy."""
    folder = TEMP_ROOT / name
    folder.mkdir(parents=True, exist_ok=True)
    os.utime(folder)  # in use: the sweep goes by age
    return folder


def start_housekeeping() -> Reaper:
    """Once per process: a reaper thread for expired jobs and old temp files."""
    global _housekeeper
    with _lock:
        if _housekeeper is None:
            s = get_settings()
            _housekeeper = Reaper(s, [lambda: sweep_old_files(TEMP_ROOT, s.temp_max_age_s)]).start()
        return _housekeeper
