"""Launch the demo in this process on a free port (tests, notebooks): `with serve() as url: ...`."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from arrcoc.settings import get_settings
from demo import service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(data_dir: Path | None = None) -> Iterator[str]:
    """The app on http://127.0.0.1:<free port>/ with its own executor (and data dir, if given)."""
    from demo.app import build_demo, launch

    old = os.environ.get("ARRCOC_SERVICE__DATA_DIR")
    if data_dir is not None:
        os.environ["ARRCOC_SERVICE__DATA_DIR"] = str(data_dir)
    get_settings.cache_clear()
    service.set_executor(None)  # a fresh executor built from these settings on first use
    demo = build_demo()
    try:
        _, url, _ = launch(
            demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True
        )
        yield url
    finally:
        demo.close()
        service.set_executor(None)
        if data_dir is not None:
            if old is None:
                os.environ.pop("ARRCOC_SERVICE__DATA_DIR", None)
            else:
                os.environ["ARRCOC_SERVICE__DATA_DIR"] = old
        get_settings.cache_clear()
