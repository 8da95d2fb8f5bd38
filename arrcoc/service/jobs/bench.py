"""Benchmark jobs: create, run the harness with the device held, fetch the report."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from ...errors import ArrcocError, JobError
from ...settings import Settings
from .files import atomic_write, job_dir, new_job_id
from .store import JobStore
from .types import BenchRequest, JobKind, JobState

if TYPE_CHECKING:
    from ..host.interface import EngineHost

log = logging.getLogger(__name__)


def create_bench_job(request: BenchRequest, settings: Settings, store: JobStore) -> str:
    job_id = new_job_id(JobKind.BENCH)
    jd = job_dir(settings, job_id)
    jd.mkdir(parents=True)
    doc = request.to_wire()
    (jd / "job.json").write_text(json.dumps({"job_id": job_id, "kind": "bench", "request": doc,
                                             "expires_at": time.time() + settings.job_ttl_s}))  # fmt: skip
    store.create(job_id, JobKind.BENCH, 1, settings.job_ttl_s, {"request": doc})
    return job_id


def run_bench_job(
    job_id: str, host: EngineHost, store: JobStore, settings: Settings,
    device_lock: Callable[[], AbstractContextManager] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run the harness with the device held (this process's lock + `device_lock`, e.g. Redis)."""
    rec = store.record(job_id)
    if JobState(rec["state"]).finished:
        return {"job_id": job_id, "skipped": rec["state"]}
    request = BenchRequest.from_wire(json.loads(rec["request"]))
    store.set_state(job_id, JobState.RUNNING, "Waiting for the device.", expect=(JobState.PENDING,))
    try:
        with (device_lock or nullcontext)():
            report, note = host.benchmark(request, _progress(store, job_id))
        note["interactive_note"] = ("Interactive requests and batch chunks on this worker waited while the"
                                    " benchmark held the device.")  # fmt: skip
        report["device_exclusive"] = note
        text = json.dumps(report)
        atomic_write(job_dir(settings, job_id) / "report.json", text.encode())
        store.set_fields(job_id, report=text)
        store.mark_item(job_id, 0)
        store.set_state(job_id, JobState.DONE, "", expect=(JobState.RUNNING,))
        return {"job_id": job_id, "done": True}
    except Exception as e:  # the report says why; the job must not stay "running"
        log.exception("benchmark job %s failed", job_id)
        msg = str(e) if isinstance(e, ArrcocError) else f"{type(e).__name__}: {e}"
        store.mark_item(job_id, 0, msg)
        store.set_state(job_id, JobState.FAILED, f"The benchmark failed: {msg}")
        return {"job_id": job_id, "error": str(e)}


def _progress(store: JobStore, job_id: str) -> Callable[[float, str], None]:
    last = [0.0]

    def report(fraction: float, message: str) -> None:
        if time.monotonic() - last[0] > 0.5 or fraction >= 1:  # not a Redis write per step
            last[0] = time.monotonic()
            store.set_fields(job_id, message=f"Device held exclusively. {fraction:.0%}: {message}")

    return report


def bench_report(job_id: str, store: JobStore, settings: Settings) -> dict[str, Any]:
    rec = store.record(job_id)
    state = JobState(rec["state"])
    if state == JobState.EXPIRED:
        raise JobError(f"Job {job_id} expired; its report was deleted. Run the benchmark again.")
    if state == JobState.FAILED:
        raise JobError(rec.get("message") or f"Benchmark job {job_id} failed.")
    if state != JobState.DONE or "report" not in rec:
        raise JobError(f"Benchmark job {job_id} is {state.value}; its report is not ready yet.")
    return json.loads(rec["report"])
