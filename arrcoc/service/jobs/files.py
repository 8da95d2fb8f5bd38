"""Where a job's files live (`<data_dir>/jobs/<id>/`) and their removal after the TTL."""

from __future__ import annotations

import json
import logging
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import ArrcocError, JobError
from ...settings import Settings
from ...tuning import ORPHAN_AGE_S, UNREACHABLE_AGE_S
from .budget import creator_gone
from .types import JobKind, JobState

if TYPE_CHECKING:
    from .store import JobStore

log = logging.getLogger(__name__)
_JOB_ID = re.compile(r"^(batch|bench)-[0-9a-f]{16}$")


def new_job_id(kind: JobKind) -> str:
    return f"{kind.value}-{secrets.token_hex(8)}"


def job_dir(settings: Settings, job_id: str) -> Path:
    if not _JOB_ID.match(job_id):
        raise JobError(f"{job_id!r} is not a job id (they look like batch-0123456789abcdef).")
    return Path(settings.service.data_dir) / "jobs" / job_id


def sweep_expired(settings: Settings, now: float | None = None) -> int:
    """Delete job folders whose TTL has passed (and orphans: no job.json a day on); returns how many."""
    root = Path(settings.service.data_dir) / "jobs"
    now = now or time.time()
    removed = 0
    for folder in root.iterdir() if root.is_dir() else ():
        if not _JOB_ID.match(folder.name) or not folder.is_dir():
            continue
        try:
            meta = folder / "job.json"
            if meta.exists():
                expires = float(json.loads(meta.read_text()).get("expires_at", now + 1))
            else:
                expires = folder.stat().st_mtime + ORPHAN_AGE_S
        except (OSError, ValueError, TypeError):
            continue
        if expires <= now:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def sweep_unreachable(settings: Settings, store: JobStore, in_memory: bool, now: float | None = None) -> int:
    """Delete the folders of jobs nobody can fetch any more, before their TTL: jobs the store does
    not know or reports expired (a flushed Redis), and, for a store held in a process's memory,
    jobs whose creating process has ended (a restart forgot them). Returns how many."""
    root = Path(settings.service.data_dir) / "jobs"
    now = now or time.time()
    removed = 0
    for folder in root.iterdir() if root.is_dir() else ():
        if not _JOB_ID.match(folder.name) or not (folder / "job.json").exists():
            continue
        try:
            if (folder / "job.json").stat().st_mtime + UNREACHABLE_AGE_S > now:
                continue
            try:
                gone = store.record(folder.name).get("state") == JobState.EXPIRED.value
            except JobError:
                gone = not in_memory or creator_gone(folder)
        except (OSError, ArrcocError):  # the store unreachable: nothing is removed on a guess
            continue
        if gone:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def sweep_old_files(root: Path, max_age_s: float, now: float | None = None) -> int:
    """Delete what sits directly under `root` (files or folders) older than max_age_s; returns how many."""
    now = now or time.time()
    removed = 0
    for entry in root.iterdir() if root.is_dir() else ():
        try:
            if entry.lstat().st_mtime + max_age_s > now:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed += 1
        except OSError:
            continue
    return removed


class Reaper:
    """A daemon thread that runs `sweep_expired` (and any extra sweeps) every `interval_s`, so an
    expired job's files go on time, not when the next job is submitted. `stop()` ends it."""

    def __init__(
        self,
        settings: Settings,
        extra: list[Callable[[], object]] | None = None,
        interval_s: float | None = None,
    ):
        self.settings = settings
        self.sweeps: list[Callable[[], object]] = [lambda: sweep_expired(settings), *(extra or [])]
        self.interval_s = float(interval_s or settings.jobs.reap_interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="arrcoc-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        return self

    def run_once(self) -> None:
        for sweep in self.sweeps:
            try:
                sweep()
            except Exception:  # noqa: BLE001 -- a sweep that failed once must not end the reaper
                log.warning("reaper: a sweep failed", exc_info=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
