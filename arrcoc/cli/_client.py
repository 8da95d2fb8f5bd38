"""Shared by `arrcoc submit` and `arrcoc job`: the Celery executor for ARRCOC_SERVICE__BROKER_URL."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..tuning import PENDING_TIMEOUT_S


def executor(broker: str | None = None, token: str | None = None):
    from ..service.client.celery_executor import CeleryExecutor
    from ..settings import get_settings

    s = get_settings()
    access = {"api_token": token.strip() or None} if token is not None else {}
    return CeleryExecutor(s.replace(service={"broker_url": broker or s.service.queue_url}, access=access))


def owner(ex) -> str | None:
    """Who this CLI is to the job store: its API token's owner (None without a token). Refused
    (AccessDenied) when the deployment requires a token and this one is missing or wrong."""
    from ..errors import ServiceUnavailableError
    from ..service.access import cli_owner

    try:
        return cli_owner(ex.store.r, ex.settings)
    except (ConnectionError, OSError) as e:
        raise ServiceUnavailableError(f"Redis did not answer ({e}); is it running?") from None


def seconds(text: str) -> float:
    """argparse type: a finite, positive number of seconds."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number of seconds above 0")
    return value


def read_input(path: Path, what: str = "file") -> bytes:
    """A file's bytes, or a one-line error that says what is wrong with the path."""
    from ..errors import InvalidInputError

    if not path.exists():
        raise InvalidInputError(f"No such {what}: {path}")
    if path.is_dir():
        raise InvalidInputError(f"{path} is a folder; give the path of the {what}.")
    try:
        return path.read_bytes()
    except OSError as e:
        raise InvalidInputError(f"Cannot read {path}: {e.strerror or e}") from None


def check_output(path: Path | None) -> None:
    """Fail before any work when an output path cannot be written ('-': stdout)."""
    from ..errors import InvalidInputError

    if path is None or str(path) == "-":
        return
    if path.is_dir():
        raise InvalidInputError(f"{path} is a folder; give a file name to write.")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InvalidInputError(f"Cannot write {path}: the folder {parent} does not exist.")
    if not os.access(parent, os.W_OK):
        raise InvalidInputError(f"Cannot write {path}: the folder {parent} is not writable.")


def describe(st) -> str:
    line = f"{st.job_id}: {st.state.value}"
    if st.kind.value == "batch":
        line += f"  {st.done} done, {st.failed} failed of {st.total}"
    if st.queue_position is not None:
        line += f"  ({st.queue_position} job(s) ahead)"
    return line + (f"  ({st.message})" if st.message else "")


def follow(
    ex,
    job_id: str,
    poll: float = 1.0,
    quiet: bool = False,
    timeout: float | None = None,
    owner: str | None = None,
):
    """Print progress until the job finishes; returns its final status. Gives up (a clear error; the
    job stays queued) after `timeout` seconds, or, without one, when no worker has picked the job
    up within PENDING_TIMEOUT_S."""
    from ..errors import ServiceUnavailableError

    last = ""
    outage_since: float | None = None
    t0 = time.monotonic()
    while True:
        waited = time.monotonic() - t0
        if timeout is not None and waited > timeout:
            raise ServiceUnavailableError(
                f"{job_id} did not finish within {timeout:.0f} s; it goes on without"
                f" this command: `arrcoc job status {job_id}`."
            )
        try:
            st = ex.status(job_id, owner=owner)
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
        if timeout is None and st.state.value == "pending" and waited > PENDING_TIMEOUT_S:
            raise ServiceUnavailableError(
                f"{job_id} is still pending after {PENDING_TIMEOUT_S:.0f} s: no worker has picked it up. Is"
                f" `arrcoc worker` running on this broker? The job stays queued: `arrcoc job status {job_id}`."
            )
        time.sleep(poll)


def match_line(result) -> str:
    """The match score in a few words: what it measures, and what a weak one means for the map."""
    from ..result import WEAK_MATCH

    if result.match_score is None:
        return "  match score: not reported"
    if result.weak_match:
        return (
            f"  match {result.match_score:.2f}: WEAK MATCH (below {WEAK_MATCH:.2f}): little here resembles the"
            " query as this model knows it; the map still shows its best guesses, scaled to their own peak"
        )
    return (
        f"  match {result.match_score:.2f}: a match (how well the query matched this image, comparable"
        f" across images; below {WEAK_MATCH:.2f} is weak)"
    )


def save_overlay(path: Path, source, result) -> None:
    """The heatmap over the image with a caption: the query, the match score and the colour scale."""
    from ..render import captioned, overlay, overlay_base

    pic = overlay(overlay_base(source), result.relevance)
    captioned(pic, result.query, result.match_score, result.weak_match).save(path)
