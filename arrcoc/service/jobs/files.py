"""Where a job's files live: `<data_dir>/jobs/<id>/`, written atomically, removed after the TTL."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path

from ...errors import JobError
from ...settings import Settings
from .types import JobKind

_JOB_ID = re.compile(r"^(batch|bench)-[0-9a-f]{16}$")


def new_job_id(kind: JobKind) -> str:
    return f"{kind.value}-{secrets.token_hex(8)}"


def job_dir(settings: Settings, job_id: str) -> Path:
    if not _JOB_ID.match(job_id):
        raise JobError(f"{job_id!r} is not a job id (they look like batch-0123456789abcdef).")
    return Path(settings.data_dir) / "jobs" / job_id


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def sweep_expired(settings: Settings, now: float | None = None) -> int:
    """Delete job folders whose TTL has passed; returns how many."""
    root = Path(settings.data_dir) / "jobs"
    now = now or time.time()
    removed = 0
    for meta in root.glob("*/job.json") if root.is_dir() else ():
        try:
            if json.loads(meta.read_text()).get("expires_at", now + 1) <= now:
                shutil.rmtree(meta.parent, ignore_errors=True)
                removed += 1
        except (OSError, ValueError):
            continue
    return removed
