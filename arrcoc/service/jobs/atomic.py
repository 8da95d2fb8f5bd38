"""A file replaced whole: written beside it under a temporary name, then renamed over it, so a
reader sees the old content or the new, never half of it."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


__all__ = ["atomic_write"]
