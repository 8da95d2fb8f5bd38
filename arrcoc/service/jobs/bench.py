"""Benchmark jobs: create, run the harness with the device held, fetch the report."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from ...errors import ArrcocError, InvalidInputError, JobCancelled, JobError
from ...settings import BACKENDS, Settings
from ...tuning import BENCH_STATUS_EVERY_S
from .atomic import atomic_write
from .files import job_dir, new_job_id
from .store import JobStore
from .types import BenchRequest, JobKind, JobState

if TYPE_CHECKING:
    from ..host.interface import EngineHost

log = logging.getLogger(__name__)

_VARIANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_DEVICE = re.compile(r"^(auto|cpu|cuda(:[0-9]{1,2})?)$")
# harness options a job may set; the rest (cache_dir, weights, startup, ...) belong to the server
_OPTIONS = {"input_sets": range(1, 9), "dtype": ("float32", "bfloat16")}


def _whole(x: object, what: str, lo: int, hi: int) -> int:
    if isinstance(x, bool) or not isinstance(x, int | float) or x != x or int(x) != x or not lo <= x <= hi:
        raise InvalidInputError(f"{what} must be a whole number from {lo} to {hi}, got {x!r}.")
    return int(x)


def check_bench_request(request: BenchRequest, settings: Settings) -> BenchRequest:
    """The request within this server's caps (iterations, warmup, buckets, variants, backends,
    device, options), or a clear error. Checked when a job is created and again when it runs."""
    s = settings
    variants, backends, buckets = request.variants, request.backends, request.buckets
    if (
        not variants
        or len(variants) > s.jobs.max_bench_variants
        or not all(isinstance(v, str) and _VARIANT.match(v) for v in variants)
    ):
        raise InvalidInputError(f"Name 1 to {s.jobs.max_bench_variants} model variants, e.g. arrcoc-texture.")
    if not backends or not all(isinstance(b, str) and b in BACKENDS for b in backends):
        raise InvalidInputError(f"Backends must be some of {', '.join(BACKENDS)}.")
    if not buckets or len(buckets) > s.jobs.max_bench_buckets:
        raise InvalidInputError(f"Choose 1 to {s.jobs.max_bench_buckets} batch buckets.")
    buckets = tuple(sorted({_whole(b, "A bucket", 1, max(s.engine.buckets)) for b in buckets}))
    iterations = _whole(request.iterations, "Iterations", 1, s.jobs.max_bench_iterations)
    warmup = _whole(request.warmup, "Warmup iterations", 0, s.jobs.max_bench_warmup)
    if not isinstance(request.device, str) or not _DEVICE.match(request.device):
        raise InvalidInputError("The device must be auto, cpu or cuda[:N].")
    options = request.options if isinstance(request.options, dict) else None
    if options is None or any(k not in _OPTIONS or options[k] not in _OPTIONS[k] for k in options):
        raise InvalidInputError(
            f"Benchmark options may set only {', '.join(_OPTIONS)} (input_sets 1-8,"
            " dtype float32 or bfloat16)."
        )
    return BenchRequest(
        tuple(dict.fromkeys(variants)),
        tuple(dict.fromkeys(backends)),
        buckets,
        iterations,
        warmup,
        request.device,
        dict(options),
    )


def create_bench_job(
    request: BenchRequest, settings: Settings, store: JobStore, owner: str | None = None
) -> str:
    request = check_bench_request(request, settings)
    job_id = new_job_id(JobKind.BENCH)
    jd = job_dir(settings, job_id)
    jd.mkdir(parents=True)
    doc = request.to_wire()
    (jd / "job.json").write_text(
        json.dumps(
            {
                "job_id": job_id,
                "kind": "bench",
                "request": doc,
                "expires_at": time.time() + settings.jobs.ttl_s,
            }
        )
    )
    store.create(
        job_id, JobKind.BENCH, 1, settings.jobs.ttl_s, {"request": doc} | ({"owner": owner} if owner else {})
    )
    return job_id


def run_bench_job(
    job_id: str,
    host: EngineHost,
    store: JobStore,
    settings: Settings,
    device_lock: Callable[[], AbstractContextManager] | None = None,
) -> dict[str, Any]:
    """Run the harness with the device held (this process's lock + `device_lock`, e.g. Redis)."""
    rec = store.record(job_id)
    if JobState(rec["state"]).finished:
        return {"job_id": job_id, "skipped": rec["state"]}
    try:  # a message queued by an older client is held to today's caps too
        request = check_bench_request(BenchRequest.from_wire(json.loads(rec["request"])), settings)
    except (ArrcocError, KeyError, TypeError, ValueError) as e:
        store.mark_item(job_id, 0, str(e))
        store.set_state(job_id, JobState.FAILED, f"The benchmark request was refused: {e}")
        return {"job_id": job_id, "error": str(e)}
    if not store.set_state(job_id, JobState.RUNNING, "Waiting for the device.", expect=(JobState.PENDING,)):
        return {"job_id": job_id, "skipped": store.record(job_id)["state"]}  # cancelled while queued
    try:
        with (device_lock or nullcontext)():
            report, note = host.benchmark(request, _progress(store, job_id, settings.jobs.bench_time_limit_s))
        note["interactive_note"] = (
            "Interactive requests and batch chunks on this worker waited while the benchmark held the device."
        )
        report["device_exclusive"] = note
        text = json.dumps(report)
        atomic_write(job_dir(settings, job_id) / "report.json", text.encode())
        store.set_fields(job_id, report=text)
        store.mark_item(job_id, 0)
        store.set_state(job_id, JobState.DONE, "", expect=(JobState.RUNNING,))
        return {"job_id": job_id, "done": True}
    except JobCancelled as e:  # the device is free again; a user's cancel stays "cancelled"
        log.info("benchmark job %s stopped: %s", job_id, e)
        store.mark_item(job_id, 0, str(e))
        store.set_state(job_id, JobState.FAILED, str(e), expect=(JobState.RUNNING,))  # the time limit
        return {"job_id": job_id, "cancelled": str(e)}
    except Exception as e:  # the report says why; the job must not stay "running"
        log.exception("benchmark job %s failed", job_id)
        msg = str(e) if isinstance(e, ArrcocError) else f"{type(e).__name__}: {e}"
        store.mark_item(job_id, 0, msg)
        store.set_state(job_id, JobState.FAILED, f"The benchmark failed: {msg}", expect=(JobState.RUNNING,))
        return {"job_id": job_id, "error": str(e)}


def _progress(store: JobStore, job_id: str, time_limit_s: float) -> Callable[[float, str], None]:
    """The harness's progress callback: a note while the job is running, and JobCancelled (which the
    harness lets through, freeing the device) once it is not: cancelled, or past its time limit.
    The note is a compare-and-set on "running", so it never overwrites "cancelled"."""
    t0 = time.monotonic()
    last, said = [0.0], [""]  # a new step's note is always written: it says what the next seconds are for

    def report(fraction: float, message: str) -> None:
        now = time.monotonic()
        if now - t0 > time_limit_s:
            raise JobCancelled(
                f"The benchmark ran past its time limit ({time_limit_s:.0f} s, ARRCOC_JOBS__BENCH_TIME_LIMIT_S)"
                " and was stopped; ask for fewer iterations, buckets or backends."
            )
        if (
            message == said[0] and now - last[0] < BENCH_STATUS_EVERY_S and fraction < 1
        ):  # not a Redis call per iteration
            return
        last[0], said[0] = now, message
        note = f"Device held exclusively. {fraction:.0%}: {message}"
        if not store.set_state(job_id, JobState.RUNNING, note, expect=(JobState.RUNNING,)):
            raise JobCancelled(f"Benchmark job {job_id} was cancelled.")

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
