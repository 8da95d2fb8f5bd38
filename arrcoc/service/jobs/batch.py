"""Batch jobs: create from a zip, run a chunk, finalize, fetch the results zip.

A batch job lives in the data store (`<data_dir>/jobs/<id>/`: inputs/, items.jsonl, results/,
results.zip) and in the job store (state, progress). Every step is idempotent: an item already
recorded is skipped; each pipeline step's rows and overlays are written atomically as one part
file (results/<time>-<rand>.part.zip) before its items are recorded; results.zip is built from
the parts in index order, one row per item (a part written by a worker that died before recording
it is outlived by the part of the item's rerun), so a redelivered chunk adds no duplicate rows.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import JobError
from ...request import Controls
from ...settings import OVERLAY_EXTENSIONS, Settings
from .archive import Item, load_items, skipped_note, unpack
from .files import job_dir, new_job_id
from .guard import process_isolated
from .parts import ItemKey, item_row, write_part
from .results_zip import ResultsZip, build_results_zip
from .store import JobStore
from .types import JobKind, JobState
from .writer import PartWriter, PendingStep

if TYPE_CHECKING:
    from ..host.interface import EngineHost, ProcessedBatch

log = logging.getLogger(__name__)


def create_batch_job(
    archive: bytes, query: str | None, controls: Controls | None, settings: Settings, store: JobStore,
    owner: str | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """Check and unpack the zip, record the job; returns its id and its chunks [start, stop).
    Expired jobs' files are removed by the reaper (files.Reaper), not here."""
    job_id = new_job_id(JobKind.BATCH)
    jd = job_dir(settings, job_id)
    jd.mkdir(parents=True)
    try:
        items = unpack(archive, query, jd, settings, owner)
        chunk = max(1, settings.batch_chunk_items)
        meta = {"job_id": job_id, "kind": "batch", "query": query, "controls": (controls or Controls()).to_wire(),
                "total": len(items), "chunk": chunk, "expires_at": time.time() + settings.job_ttl_s}  # fmt: skip
        (jd / "job.json").write_text(json.dumps(meta))
        store.create(job_id, JobKind.BATCH, len(items), settings.job_ttl_s,
                     {"controls": meta["controls"], "chunk": str(chunk), "skipped": skipped_note(jd)}
                     | ({"owner": owner} if owner else {}))  # fmt: skip
    except BaseException:
        shutil.rmtree(jd, ignore_errors=True)
        raise
    return job_id, [(i, min(i + chunk, len(items))) for i in range(0, len(items), chunk)]


# -- running a chunk --------------------------------------------------------------------------
# A chunk runs as a pipeline of steps, bounded (one step read ahead, IN_FLIGHT in the engine host,
# WRITE_QUEUE being written): while the engine host decodes, runs and renders step k, a thread reads
# step k+1's files and the part writer (arrcoc.service.jobs.writer) writes step k-1's results,
# recorded here once on disk. A step is one engine-host call: decoded
# together (on the GPU when it can), run in the largest buckets, overlays encoded together: two
# engine batches (64 items on a GPU), at least 8 (a CPU runs one at a time) so that progress moves
# on a small job. One call runs at a time when the engine shares this process: two at once ran
# slower on the H100 (764 vs 918 images/s, scripts/batch_probe.py), the stages contending for the
# GIL, not the device; but on a GPU the next step is queued behind it (STEPS_QUEUED), so the
# engine host's thread starts it as soon as the last returns instead of idling while this thread
# hands the last to the writer and submits the next (H100: 1,734 against 1,567 images/s,
# scripts/batch_probe.py, benchmarks/2026-11-26-h100-queued-step-ab/). Not on a CPU, where the
# engine keeps every core busy itself and the queue only puts this thread's work beside it (2-core
# machine: 24.2 against 26.5 images/s, the same probe, BENCHMARKS.md). Two run at once when the
# engine is in another process (a worker group's): one step's images cross the socket while the
# engine process decodes the last (a one-chunk job of 12 MP JPEGs through Celery on the H100: 199.5
# images/s with two, 85.4 with one; arrcoc bench e2e at 4e8fda2 and e8ccee6).
STEP_ITEMS = 64
MIN_STEP_ITEMS = 8
IN_FLIGHT = 1
REMOTE_IN_FLIGHT = 2
STEPS_QUEUED = 2  # steps handed to the engine host, running or waiting, not yet taken back
WRITE_QUEUE = 2  # steps handed to the writer, not yet recorded: one written, one waiting, so that the
# next engine call is not held up by a write that runs a little longer than its step


def step_items(host: EngineHost) -> int:
    """Items in one pipeline step (one engine-host call) on this host."""
    return min(STEP_ITEMS, max(MIN_STEP_ITEMS, 2 * host.max_batch))


def _key(it: Item) -> ItemKey:
    return it.index, it.file, it.query


def _fail_items(jd: Path, store: JobStore, job_id: str, failed: list[tuple[Item, str]]) -> None:
    if failed:
        write_part(jd, [(item_row(_key(it), False, message), None, "") for it, message in failed])
        store.mark_items(job_id, [(it.index, message) for it, message in failed])


def run_chunk(
    job_id: str, start: int, stop: int, host: EngineHost, store: JobStore, settings: Settings,
    deadline: float | None = None, yield_now: Callable[[], bool] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Process items [start, stop) of a batch job; skips what is already recorded. `yield_now`,
    asked between steps, stops the chunk early (what ran is recorded; "yielded" in the answer):
    the in-process scheduler turns to another owner's job."""
    t_chunk = time.perf_counter()
    rec = store.record(job_id)
    state = JobState(rec["state"])
    if state in (JobState.CANCELLED, JobState.EXPIRED, JobState.FAILED):
        return {"job_id": job_id, "skipped": state.value}
    store.set_state(job_id, JobState.RUNNING, expect=(JobState.PENDING,))
    jd = job_dir(settings, job_id)
    (jd / "results").mkdir(exist_ok=True)
    controls = Controls.from_wire(json.loads(rec.get("controls") or "{}"))
    every = load_items(jd)
    items = every[start:stop]
    finished = store.finished_items(job_id, [it.index for it in items])
    todo = [it for it in items if it.index not in finished]
    attempts = store.attempt_items(job_id, [it.index for it in todo])
    fresh: list[Item] = []
    suspect: list[Item] = []
    skipped: list[tuple[Item, str]] = []
    for it, n in zip(todo, attempts, strict=True):
        if n > settings.max_redeliveries:
            skipped.append((it, f"Skipped after {n - 1} attempts: the worker stopped each time it processed"
                                " this item (crash, out of memory or time limit)."))  # fmt: skip
        else:
            (suspect if n > 1 else fresh).append(it)
    _fail_items(jd, store, job_id, skipped)
    stages: dict[str, float] = {}
    processed = 0
    # a job run whole from its start (in-process, or one Celery chunk) writes results.zip as it goes
    streamed = ResultsZip(jd) if len(fresh) == len(every) else None
    yielded: list[bool] = []

    def yielding() -> bool:
        if yield_now is not None and yield_now():
            yielded.append(True)
        return bool(yielded)

    try:
        for group in [fresh] + [[it] for it in suspect]:  # after a crash, suspects run alone
            if not group or yielded:
                continue
            done = _run_group(job_id, jd, group, controls, host, store, settings, deadline, stages, streamed, yielding)
            if done is None:
                return {"job_id": job_id, "skipped": "cancelled", "processed": processed, "stage_ms": stages}
            processed += done
        t_final = time.perf_counter()

        def record() -> None:  # before the job reads as done: whoever sees it done sees its timings too
            _add(stages, "finalize", t_final)
            _add(stages, "chunk", t_chunk)
            if streamed is not None:
                stages["results_zip"] = streamed.ms
            store.add_stage_ms(job_id, stages)

        maybe_finalize(job_id, store, settings, before_done=record, streamed=streamed)
    finally:
        if streamed is not None and not streamed.finished:
            streamed.abandon()
    return {"job_id": job_id, "processed": processed, "stage_ms": stages, "yielded": bool(yielded)}


def _read(jd: Path, items: list[Item]) -> list[bytes]:
    out = []
    opened: dict[str, Any] = {}
    try:
        for it in items:
            try:
                out.append(it.read(jd, opened))
            except OSError:
                out.append(b"")  # reported by the decoder as an empty image
    finally:
        for f in opened.values():
            f.close()
    return out


def _run_group(job_id: str, jd: Path, group: list[Item], controls: Controls, host: EngineHost, store: JobStore,
               settings: Settings, deadline: float | None, stages: dict[str, float],
               streamed: ResultsZip | None, yield_now: Callable[[], bool] | None = None) -> int | None:  # fmt: skip
    """The group's items through the pipeline; how many ran, or None if the job was cancelled.
    Each part, once recorded, goes into `streamed` (which gives up if they come out of order)."""
    size = step_items(host)
    steps = [group[i : i + size] for i in range(0, len(group), size)]
    fmt = settings.overlay_format
    ext = OVERLAY_EXTENSIONS.get(fmt, "")  # "none": no picture
    # auto: a child process where the engine shares this process's GIL and leaves the cores to it (a
    # GPU's); an engine on the CPU keeps every core busy itself (the child slowed its stage on the
    # 2-core machine: 33 vs 24 ms an item, scripts/batch_probe.py)
    writer = PartWriter(settings.batch_writer == "process"
                        or (settings.batch_writer == "auto" and host.in_this_process and not host.on_cpu))  # fmt: skip
    in_flight = IN_FLIGHT if host.in_this_process else REMOTE_IN_FLIGHT
    queued = 1 if host.in_this_process and host.on_cpu else STEPS_QUEUED
    with ThreadPoolExecutor(1, thread_name_prefix="arrcoc-read") as reader, \
            ThreadPoolExecutor(in_flight, thread_name_prefix="arrcoc-engine") as engine:  # fmt: skip
        reading = reader.submit(_read, jd, steps[0])
        running: deque[tuple[list[Item], Future[ProcessedBatch]]] = deque()
        writing: deque[PendingStep] = deque()
        ran = 0

        def written() -> None:  # the oldest step being written, once on disk, recorded
            step = writing.popleft().result()
            store.mark_items(job_id, step.marks)
            stages["write"] = stages.get("write", 0.0) + step.ms
            if streamed is not None:
                streamed.add_part(step.part)

        def write_next() -> None:  # the oldest step in flight, once processed, to the writer
            nonlocal ran
            step, future = running.popleft()
            t0 = time.perf_counter()
            batch = future.result()
            _add(stages, "engine_wait", t0)
            for name, ms in batch.stage_ms.items():
                stages[name] = stages.get(name, 0.0) + ms
            t1 = time.perf_counter()
            if len(writing) == WRITE_QUEUE:  # back-pressure: WRITE_QUEUE steps being written at most
                written()
            _add(stages, "write_wait", t1)
            writing.append(writer.submit(jd, [_key(it) for it in step], batch.items, ext))
            ran += len(step)

        try:
            for k, step in enumerate(steps):
                t0 = time.perf_counter()
                datas = reading.result()
                _add(stages, "read_wait", t0)
                if k + 1 < len(steps):
                    reading = reader.submit(_read, jd, steps[k + 1])
                if JobState(store.record(job_id)["state"]) == JobState.CANCELLED:
                    for _, future in running:  # what is in flight finishes, unrecorded
                        future.result()
                    while writing:
                        written()
                    return None
                if k > 0 and yield_now is not None and yield_now():
                    break  # what is in flight is written and recorded below
                if deadline is not None and time.monotonic() > deadline:
                    _fail_items(jd, store, job_id, [(it, "The chunk ran past its time limit; this item was not processed.")
                                                    for it in step])  # fmt: skip
                    continue
                running.append((step, engine.submit(process_isolated, host, datas, [it.query for it in step], controls, fmt)))
                if len(running) == queued:
                    write_next()
            while running:
                write_next()
            while writing:
                written()
        finally:
            writer.close()
    return ran


def _add(stages: dict[str, float], name: str, since: float) -> None:
    stages[name] = stages.get(name, 0.0) + (time.perf_counter() - since) * 1e3


# -- finishing ------------------------------------------------------------------------------------
def maybe_finalize(job_id: str, store: JobStore, settings: Settings, before_done: Callable[[], None] | None = None,
                   streamed: ResultsZip | None = None) -> bool:  # fmt: skip
    """Once every item is recorded, build results.zip (finish `streamed` if it holds them all)
    and mark the job done. Idempotent. `before_done` runs once: between the two, or before
    returning when the job is not done."""
    st = store.status(job_id)
    if st.done + st.failed < st.total or st.state in (JobState.CANCELLED, JobState.EXPIRED):
        if before_done is not None:
            before_done()
        return False
    jd = job_dir(settings, job_id)
    if not (jd / "results.zip").exists() or st.state != JobState.DONE:
        if streamed is not None and streamed.complete(st.total):
            streamed.finish()
        else:
            build_results_zip(jd)
    if before_done is not None:
        before_done()
    if st.state.finished:
        return True
    if st.done == 0 and st.total:
        first = next(iter(store.failed_items(job_id).values()), "")
        return store.set_state(job_id, JobState.FAILED, f"Every item failed; the first: {first}",
                               expect=(JobState.PENDING, JobState.RUNNING))  # fmt: skip
    note = f"{st.failed} of {st.total} items failed; see summary.csv." if st.failed else ""
    return store.set_state(job_id, JobState.DONE, note, expect=(JobState.PENDING, JobState.RUNNING))


def results_zip(job_id: str, store: JobStore, settings: Settings) -> Path:
    st = store.status(job_id)
    if st.state == JobState.EXPIRED:
        raise JobError(f"Job {job_id} expired; its results were deleted. Submit it again.")
    if st.kind != JobKind.BATCH:
        raise JobError(f"Job {job_id} is a {st.kind.value} job; it has a report, not a results zip.")
    jd = job_dir(settings, job_id)
    if st.state == JobState.CANCELLED or (st.state == JobState.FAILED and not (jd / "results.zip").exists()):
        return build_results_zip(jd)  # whatever was recorded before the cancel or the failure (a full disk)
    if st.state not in (JobState.DONE, JobState.FAILED) or not (jd / "results.zip").exists():
        raise JobError(f"Job {job_id} is {st.state.value} ({st.done + st.failed}/{st.total}); fetch it when done.")
    return jd / "results.zip"
