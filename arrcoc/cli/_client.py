"""Shared by `arrcoc submit` and `arrcoc job`: the Celery executor for ARRCOC_BROKER_URL."""

from __future__ import annotations

import sys
import time


def executor(broker: str | None = None):
    from ..service.client.celery_executor import CeleryExecutor
    from ..settings import get_settings

    s = get_settings()
    return CeleryExecutor(s.model_copy(update={"broker_url": broker or s.queue_url}))


def describe(st) -> str:
    line = f"{st.job_id}: {st.state.value}"
    if st.kind.value == "batch":
        line += f"  {st.done} done, {st.failed} failed of {st.total}"
    if st.queue_position is not None:
        line += f"  ({st.queue_position} job(s) ahead)"
    return line + (f"  ({st.message})" if st.message else "")


def follow(ex, job_id: str, poll: float = 1.0, quiet: bool = False):
    """Print progress until the job finishes; returns its final status."""
    from ..errors import ServiceUnavailableError

    last = ""
    outage_since: float | None = None
    while True:
        try:
            st = ex.status(job_id)
            outage_since = None
        except ServiceUnavailableError as e:  # a Redis restart: keep following for a while
            outage_since = outage_since or time.monotonic()
            if time.monotonic() - outage_since > 60:
                raise
            if not quiet:
                print(f"{job_id}: waiting for Redis ({e})", file=sys.stderr, flush=True)
            time.sleep(max(poll, 2.0))
            continue
        line = describe(st)
        if line != last and not quiet:
            print(line, file=sys.stderr, flush=True)
            last = line
        if st.state.finished:
            return st
        time.sleep(poll)
