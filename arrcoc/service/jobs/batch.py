"""Batch jobs: create from a zip, run a chunk, finalize, fetch the results zip.

A batch job lives in the data store (`<data_dir>/jobs/<id>/`: inputs/, items.jsonl, results/,
results.parquet, results.zip) and in the job store (state, progress). Every step is idempotent:
an item already recorded is skipped; each pipeline step's rows are written atomically as one part
file (results/<time>-<rand>.part.zip), after its overlays are on disk (in the part, or in the
results.zip being written, which the part names) and before its items are recorded; results.parquet
and results.zip are built from the parts in index order, one row per item (a part written by a
worker that died before recording it is outlived by the part of the item's rerun), so a
redelivered chunk adds no duplicate rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ...errors import JobError
from ...request import Controls, check_overlays
from ...settings import DEFAULT_OVERLAY_KIND, OVERLAY_EXTENSIONS, Settings
from ..host.interface import ProcessedBatch, StepOutputs
from .archive import ARCHIVE, CorruptEntry, Item, PendingArchive, load_items, skipped_note, unpack
from .files import job_dir, new_job_id
from .finishing import finishing, follow, maybe_finalize
from .guard import process_isolated
from .parts import Mark, picture_names, step_marks, write_part
from .results import ItemKey, step_table, summary_lines
from .results_zip import ResultsZip, build_results_zip
from .store import JobStore
from .types import JobKind, JobState

if TYPE_CHECKING:
    from ..host.interface import EngineHost

log = logging.getLogger(__name__)


def create_batch_job(
    archive: bytes,
    query: str | None,
    controls: Controls | None,
    settings: Settings,
    store: JobStore,
    owner: str | None = None,
    overlays: str | None = None,
    paid_by: str | None = None,
    defer_archive: bool = False,
) -> tuple[str, list[tuple[int, int]], PendingArchive | None]:
    """Check and unpack the zip, record the job; returns its id, its chunks [start, stop) and,
    with `defer_archive`, its zip still in memory, which its steps read from (None: all on disk).
    `overlays`: the pictures it draws (arrcoc.settings.OVERLAYS; None: none, rows only);
    `paid_by`: whose disk share its reservation counts against (budget.payer; None: the owner's).
    Expired jobs' files are removed by the reaper (files.Reaper), not here."""
    drawn = check_overlays(overlays)  # a bad value is refused before anything is unpacked
    job_id = new_job_id(JobKind.BATCH)
    jd = job_dir(settings, job_id)
    jd.mkdir(parents=True)
    try:
        items = unpack(
            archive,
            query,
            jd,
            settings,
            owner,
            paid_by=paid_by,
            pictures=drawn != "none",
            write_archive=not defer_archive,
        )
        in_place = any(it.path == ARCHIVE for it in items)
        pending = PendingArchive(archive, jd / ARCHIVE) if defer_archive and in_place else None
        chunk = max(1, settings.batching.chunk_items)
        # job.json is the reaper's: it tells when the folder's files go
        (jd / "job.json").write_text(json.dumps({"expires_at": time.time() + settings.jobs.ttl_s}))
        record = {
            "controls": (controls or Controls()).to_wire(),
            "overlays": drawn,
            "skipped": skipped_note(jd),
        }
        store.create(
            job_id,
            JobKind.BATCH,
            len(items),
            settings.jobs.ttl_s,
            record | ({"owner": owner} if owner else {}),
        )
    except BaseException:
        shutil.rmtree(jd, ignore_errors=True)
        raise
    return job_id, chunks_of(len(items), chunk), pending


def chunks_of(total: int, size: int) -> list[tuple[int, int]]:
    """[0, total) cut into chunks [start, stop) of `size` items, the job's last quarter into chunks
    a quarter as large. Through Celery chunks run side by side and end about together, and the
    job's first chunk appends their rows to results.zip in index order (finishing.follow): what
    the last ones leave to append once they end is the job's serial tail, and smaller last chunks
    leave less. A job of one chunk stays one."""
    if total <= size:
        return [(0, total)] if total else []
    small = max(1, size // 4)
    split = (total - total // 4) // size * size  # whole chunks of `size` up to the last quarter
    return [(a, a + size) for a in range(0, split, size)] + [
        (a, min(a + small, total)) for a in range(split, total, small)
    ]


# -- running a chunk --------------------------------------------------------------------------
# A chunk runs step by step; a step is one engine-host call: its items decoded together (on the
# GPU when it can), run in the largest buckets, overlays drawn and encoded together, its results
# written as one part. Two engine batches a step, at least 8 so that progress moves on a CPU,
# which runs one image at a time. A step's fixed costs (an nvJPEG call's device
# wait, the step's part, row group and record) are paid per step, so the largest step the engine
# batches allow.
STEP_ITEMS = 128
MIN_STEP_ITEMS = 8
# A step also ends at this much input (at least one item): its photos' bytes are in memory while it
# runs, a few steps at once, so large photos go fewer to a step. A step of 12 MP photos still holds
# dozens: nvJPEG's hardware decoder, which such a job waits for, is kept busy only by several
# photos a call.
STEP_BYTES = 32 << 20


def step_items(host: EngineHost) -> int:
    """Items in one pipeline step (one engine-host call) on this host."""
    return min(STEP_ITEMS, max(MIN_STEP_ITEMS, 2 * host.max_batch))


def steps_in_flight(host: EngineHost, settings: Settings) -> int:
    """Steps of a chunk run at once: several on an accelerator, where one step decodes and runs
    while another's results are drawn (docs/service.md#concurrency); one on a CPU, where the
    engine's threads take every core that a second step's decoding would compete for."""
    return 1 if host.on_cpu else settings.batching.steps_in_flight


def steps_of(group: list[Item], size: int, ramp: bool = False) -> list[list[Item]]:
    """`group` cut into steps, in order, of at most `size` items and STEP_BYTES of input each (an
    item larger than that alone). With `ramp` (for steps that run side by side) the first step is
    cut into a quarter, a quarter and a half, and the last into a half, a quarter and a quarter: the
    decoder starts on a few items while the next are still being read, and little is left to draw
    and write once the last decode ends. A job of large photos is a few steps long, so its start
    and end are much of its time."""
    steps: list[list[Item]] = []
    step: list[Item] = []
    held = 0
    for it in group:
        n = max(it.length, 0)
        if step and (len(step) == size or held + n > STEP_BYTES):
            steps.append(step)
            step, held = [], 0
        step.append(it)
        held += n
    steps = [*steps, step] if step else steps
    if not ramp or not steps:
        return steps
    head = _quartered(steps[0])
    if len(steps) == 1:
        return head
    return [*head, *steps[1:-1], *_quartered(steps[-1], from_end=True)]


def _quartered(step: list[Item], from_end: bool = False) -> list[list[Item]]:
    """A step as a quarter, a quarter and the rest, or `from_end` as the rest, a quarter and a
    quarter (steps of fewer than 4 items as they are)."""
    q = len(step) // 4
    if not q:
        return [step]
    a, b = (len(step) - 2 * q, len(step) - q) if from_end else (q, 2 * q)
    return [step[:a], step[a:b], step[b:]]


def _key(it: Item) -> ItemKey:
    return it.index, it.file, it.query


def _fail_items(jd: Path, store: JobStore, job_id: str, failed: list[tuple[Item, str]]) -> None:
    if failed:
        keys = [_key(it) for it, _ in failed]
        errors = [message for _, message in failed]
        outputs = StepOutputs.failed(len(failed))
        none = [None] * len(failed)
        write_part(jd, step_table(keys, outputs, errors, none), none, none)
        store.mark_items(job_id, step_marks(keys, outputs.ok, errors))


def run_chunk(
    job_id: str,
    start: int,
    stop: int,
    host: EngineHost,
    store: JobStore,
    settings: Settings,
    deadline: float | None = None,
    yield_now: Callable[[], bool] | None = None,
    following: Callable[[], contextlib.AbstractContextManager[bool]] | None = None,
    pending: PendingArchive | None = None,
) -> dict[str, Any]:
    """Process items [start, stop) of a batch job; skips what is already recorded. `yield_now`,
    asked between steps, stops the chunk early (what ran is recorded; "yielded" in the answer):
    the in-process scheduler turns to another owner's job. `following`: the chunk that begins the
    job, once its own items ran, goes on writing results.zip while the job's other chunks run
    (finishing.follow) within `following()`, when that says it may (a Celery worker's chunk).
    `pending`: the job's zip while it is in memory (create_batch_job), which the steps read from."""
    t_chunk = time.perf_counter()
    rec = store.record(job_id)
    state = JobState(rec["state"])
    if state in (JobState.CANCELLED, JobState.EXPIRED, JobState.FAILED):
        return {"job_id": job_id, "skipped": state.value}
    store.set_state(job_id, JobState.RUNNING, expect=(JobState.PENDING,))
    jd = job_dir(settings, job_id)
    (jd / "results").mkdir(exist_ok=True)
    controls = Controls.from_wire(json.loads(rec.get("controls") or "{}"))
    # a job queued before `overlays` existed named only what its pictures showed
    drawn = check_overlays(rec.get("overlays") or rec.get("overlay_kind") or "none")
    total = int(rec["total"])
    items = load_items(jd, start, stop)
    finished = store.finished_items(job_id, [it.index for it in items])
    todo = [it for it in items if it.index not in finished]
    # an attempt is counted when an item's step is handed to the engine (_run_group): items a
    # yielded turn never reached are not suspects, those a dead worker was running are
    attempts = store.attempts_of(job_id, [it.index for it in todo])
    fresh: list[Item] = []
    suspect: list[Item] = []
    skipped: list[tuple[Item, str]] = []
    for it, n in zip(todo, attempts, strict=True):
        if n >= settings.jobs.max_redeliveries:
            skipped.append(
                (
                    it,
                    f"Skipped after {n} attempts: the worker stopped each time it processed"
                    " this item (crash, out of memory or time limit).",
                )
            )
        else:
            (suspect if n else fresh).append(it)
    _fail_items(jd, store, job_id, skipped)
    stages: dict[str, float] = {}
    processed = 0
    # a chunk that begins the job, none of it recorded yet, writes results.zip as it goes
    streamed = ResultsZip(jd, settings.jobs.results_jsonl) if start == 0 and fresh == items else None
    yielded: list[bool] = []

    asked: list[bool] = []

    def yielding() -> bool:
        """Asked before every step: each turn runs its first step, so every job moves."""
        if asked and yield_now is not None and yield_now():
            yielded.append(True)
        asked.append(True)
        return bool(yielded)

    try:
        for group in [fresh] + [[it] for it in suspect]:  # after a crash, suspects run alone
            if not group or yielded:
                continue
            done = _run_group(
                job_id,
                jd,
                group,
                controls,
                drawn,
                host,
                store,
                settings,
                deadline,
                stages,
                streamed,
                yielding,
                pending,
                ramp=start == 0 and stop >= total,
            )
            if done is None:
                return {"job_id": job_id, "skipped": "cancelled", "processed": processed, "stage_ms": stages}
            processed += done
        _add(stages, "chunk", t_chunk)
        t_final = time.perf_counter()

        def record() -> None:  # before the job reads as done: whoever sees it done sees its timings too
            _add(stages, "finalize", t_final)
            if streamed is not None:
                stages["results_zip"] = streamed.ms
            store.add_stage_ms(job_id, stages)

        if streamed is not None and stop < total and following is not None:
            with following() as allowed, finishing(jd) as mine:
                if allowed and mine:
                    follow(job_id, streamed, total, store, deadline)
                    _add(stages, "follow", t_final)  # beside the other chunks: not a serial end
                    t_final = time.perf_counter()
                    if streamed.complete(total):
                        maybe_finalize(job_id, store, settings, record, streamed, locked=True)
                        return {"job_id": job_id, "processed": processed, "stage_ms": stages}
        maybe_finalize(job_id, store, settings, before_done=record, streamed=streamed)
    finally:
        if streamed is not None and not streamed.finished:
            streamed.abandon()
    return {"job_id": job_id, "processed": processed, "stage_ms": stages, "yielded": bool(yielded)}


def _read(
    jd: Path, items: list[Item], pending: PendingArchive | None = None
) -> tuple[list[bytes], list[str | None]]:
    """The items' bytes (from `pending`'s memory where it holds them, else from disk), and per item
    why they could not be read (None: they were)."""
    datas: list[bytes] = []
    errors: list[str | None] = []
    opened: dict[str, Any] = {}
    try:
        for it in items:
            try:
                data = pending.read(it) if pending is not None else None
                datas.append(it.read(jd, opened) if data is None else data)
                errors.append(None)
            except CorruptEntry as e:
                datas.append(b"")
                errors.append(str(e))
            except OSError as e:
                datas.append(b"")
                errors.append(f"The item's input could not be read ({type(e).__name__}); submit it again.")
    finally:
        for f in opened.values():
            f.close()
    return datas, errors


def _run_group(
    job_id: str,
    jd: Path,
    group: list[Item],
    controls: Controls,
    drawn: str,
    host: EngineHost,
    store: JobStore,
    settings: Settings,
    deadline: float | None,
    stages: dict[str, float],
    streamed: ResultsZip | None,
    yield_now: Callable[[], bool] | None = None,
    pending: PendingArchive | None = None,
    ramp: bool = False,
) -> int | None:
    """The group's items through the batch pipeline, step by step; how many ran, or None if the
    job was cancelled. Each step goes read -> decode -> engine -> outputs (overlays when asked) ->
    sink on one of `steps_in_flight` step threads, the sink in step order: a step is written and
    recorded after the one before it, so while one writes, the next is on the device. This thread
    hands the steps out, asking before each whether the job was cancelled, another owner waits
    (`yield_now`) or the deadline passed; what was handed out is recorded whatever stops it.
    `ramp`: the group is the whole job, whose start and end nothing else runs beside (`steps_of`);
    a chunk among others through Celery runs beside them, and cuts no more steps than it needs."""
    fmt = "none" if drawn == "none" else settings.jobs.overlay_format
    kind = DEFAULT_OVERLAY_KIND if drawn == "none" else drawn
    sink = _Sink(job_id, jd, store, OVERLAY_EXTENSIONS.get(fmt, ""), stages, streamed)
    in_flight = steps_in_flight(host, settings)
    running: deque[tuple[list[Item], Future]] = deque()
    before: Future | None = None  # the step handed out last: the next one is written after it
    ran = 0
    cancelled = False
    try:
        for step in steps_of(group, step_items(host), ramp=ramp and in_flight > 1):
            if len(running) == in_flight:  # a step is over (written) before another starts: bounded memory
                done, future = running.popleft()
                future.result()
                ran += len(done)
            if JobState(store.record(job_id)["state"]) == JobState.CANCELLED:
                cancelled = True
                break
            if yield_now is not None and yield_now():
                break
            if deadline is not None and time.monotonic() > deadline:
                late = "The chunk ran past its time limit; this item was not processed."
                _fail_items(jd, store, job_id, [(it, late) for it in step])
                continue
            store.attempt_items(job_id, [it.index for it in step])
            # the engine host's step threads (docs/service.md#concurrency), shared with other chunks
            before = host.step_pool.submit(
                _run_step, host, jd, step, controls, fmt, kind, before, sink, pending
            )
            running.append((step, before))
    finally:  # nothing of this chunk runs on once it returns
        wait([future for _, future in running])
    for done, future in running:  # every step handed out has ended: written, or failed
        future.result()
        ran += len(done)
    return None if cancelled else ran


def _run_step(
    host: EngineHost,
    jd: Path,
    step: list[Item],
    controls: Controls,
    fmt: str,
    kind: str,
    before: Future | None,
    sink: _Sink,
    pending: PendingArchive | None = None,
) -> None:
    """A step thread's work: the step from its files to its rows (and its part, when its pictures
    need no place in a results.zip written in order), then, once the step before it is in the sink
    (a step after a failed one is not: its items are run again), its place in index order."""
    t0 = time.perf_counter()
    datas, unread = _read(jd, step, pending)
    read_ms = (time.perf_counter() - t0) * 1e3
    batch = process_isolated(host, datas, [it.query for it in step], controls, fmt, kind)
    for i, why in enumerate(unread):  # said as it is, not as the empty image the decoder saw
        if why is not None:
            batch.errors[i] = why
    batch.stage_ms["read"] = batch.stage_ms.get("read", 0.0) + read_ms
    rows = sink.rows(step, batch)
    if before is not None:
        before.result()
    sink.write(rows)


@dataclass
class _StepRows:
    """A step's results as the sink takes them: its rows, its pictures, what recording it takes,
    and whether its part is on disk (and its items recorded) already."""

    index: list[int]
    table: pa.Table
    names: list[str | None]
    pictures: list[bytes | None]
    marks: list[Mark]
    summary: bytes | None  # its summary.csv lines, when results.zip is written as the job runs
    recorded: bool
    stage_ms: dict[str, float]


@dataclass
class _Sink:
    """Where a chunk's steps end. `rows` runs on each step's own thread, side by side: the step's
    table, and, unless its pictures go into `streamed`, its part and its items recorded. `write`
    runs once per step in index order: the pictures into `streamed` (then the part, naming where
    they are, and the items recorded), then the rows into `streamed`."""

    job_id: str
    jd: Path
    store: JobStore
    ext: str  # the pictures' extension; "": none drawn
    stages: dict[str, float]
    streamed: ResultsZip | None

    def rows(self, step: list[Item], batch: ProcessedBatch) -> _StepRows:
        t0 = time.perf_counter()
        keys = [_key(it) for it in step]
        names = picture_names(keys, batch.overlays, batch.outputs.ok, self.ext)
        table = step_table(keys, batch.outputs, batch.errors, names)
        marks = step_marks(keys, batch.outputs.ok, batch.errors)
        in_order = self.streamed is not None and any(n is not None for n in names)
        if not in_order:
            write_part(self.jd, table, names, batch.overlays)
            self.store.mark_items(self.job_id, marks)  # recorded once its part is on disk
        summary = summary_lines(table) if self.streamed is not None else None
        stage_ms = dict(batch.stage_ms)
        stage_ms["write"] = stage_ms.get("write", 0.0) + (time.perf_counter() - t0) * 1e3
        return _StepRows(
            [k[0] for k in keys], table, names, batch.overlays, marks, summary, not in_order, stage_ms
        )

    def write(self, step: _StepRows) -> None:
        for name, ms in step.stage_ms.items():
            self.stages[name] = self.stages.get(name, 0.0) + ms
        t0 = time.perf_counter()
        if self.streamed is not None:
            stored = self.streamed.add_pictures(step.index, step.names, step.pictures)
            if not step.recorded:
                write_part(self.jd, step.table, step.names, step.pictures, stored)
                self.store.mark_items(self.job_id, step.marks)
            self.streamed.add_rows(step.table, step.summary)
        _add(self.stages, "write", t0)


def _add(stages: dict[str, float], name: str, since: float) -> None:
    stages[name] = stages.get(name, 0.0) + (time.perf_counter() - since) * 1e3


# -- fetching -------------------------------------------------------------------------------------
def results_zip(job_id: str, store: JobStore, settings: Settings) -> Path:
    st = store.status(job_id)
    if st.state == JobState.EXPIRED:
        raise JobError(f"Job {job_id} expired; its results were deleted. Submit it again.")
    if st.kind != JobKind.BATCH:
        raise JobError(f"Job {job_id} is a {st.kind.value} job; it has a report, not a results zip.")
    jd = job_dir(settings, job_id)
    if st.state == JobState.CANCELLED or (st.state == JobState.FAILED and not (jd / "results.zip").exists()):
        # whatever was recorded before the cancel or the failure (a full disk)
        return build_results_zip(jd, settings.jobs.results_jsonl)
    if st.state not in (JobState.DONE, JobState.FAILED) or not (jd / "results.zip").exists():
        raise JobError(
            f"Job {job_id} is {st.state.value} ({st.done + st.failed}/{st.total}); fetch it when done."
        )
    return jd / "results.zip"
