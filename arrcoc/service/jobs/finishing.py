"""A batch job's end: results.zip finished by one process, and the job marked done.

Every item recorded, results.zip is finished from what was written as the job ran, or built from
the parts (arrcoc.service.jobs.results_zip). One process at a time finishes a job, never waiting
for another: the others leave it to the one that does, so a job of many chunks through Celery is
not built once per chunk that ends last. The first chunk's worker (through Celery, where a job's
chunks run in several processes at once) may go on writing results.zip while the other chunks
run, appending their parts as their items are recorded (`follow`): then finishing is all that is
left when the last chunk ends. Holding the job's finish lock is what tells the others it will
finish the job; the kernel lets go of the lock with its process, so a worker killed while
following leaves the job to whoever ends a chunk next (its own chunk, delivered again, at the
latest).
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ...settings import Settings
from ...tuning import FOLLOW_POLL_S
from .budget import release
from .files import job_dir
from .parts import Part, read_parts, runs
from .results_zip import ResultsZip, build_results_zip
from .store import JobStore
from .types import JobState

FINISH_LOCK = ".finish.lock"  # in results/: held by the process finishing the job's results


@contextlib.contextmanager
def finishing(jd: Path) -> Iterator[bool]:
    """Whether this process finishes the job's results: True while it holds the job's finish lock,
    False at once when another process (or thread) holds it."""
    (jd / "results").mkdir(exist_ok=True)
    with open(jd / "results" / FINISH_LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # closing the file lets go of the lock


def maybe_finalize(
    job_id: str,
    store: JobStore,
    settings: Settings,
    before_done: Callable[[], None] | None = None,
    streamed: ResultsZip | None = None,
    locked: bool = False,
) -> bool:
    """Once every item is recorded, build results.zip (finish `streamed` if it holds them all)
    and mark the job done; unless another process is finishing it (`locked`: this one holds the
    lock already). Idempotent. `before_done` runs once: between the two, or before returning when
    this call does not finish the job."""
    st = store.status(job_id)
    if st.done + st.failed < st.total or st.state in (JobState.CANCELLED, JobState.EXPIRED):
        if before_done is not None:
            before_done()
        return False
    jd = job_dir(settings, job_id)
    with contextlib.nullcontext(True) if locked else finishing(jd) as mine:
        if not mine:  # the holder finishes the job
            if before_done is not None:
                before_done()
            return False
        if not (jd / "results.zip").exists() or st.state != JobState.DONE:
            if streamed is not None and streamed.complete(st.total):
                streamed.finish()
            else:
                build_results_zip(jd, settings.jobs.results_jsonl)
    release(jd)  # every item recorded: its inputs go before anyone sees the job finished
    if before_done is not None:
        before_done()
    if st.state.finished:
        return True
    if st.done == 0 and st.total:
        first = next(iter(store.failed_items(job_id).values()), "")
        return store.set_state(
            job_id,
            JobState.FAILED,
            f"Every item failed; the first: {first}",
            expect=(JobState.PENDING, JobState.RUNNING),
        )
    note = f"{st.failed} of {st.total} items failed; see summary.csv." if st.failed else ""
    return store.set_state(job_id, JobState.DONE, note, expect=(JobState.PENDING, JobState.RUNNING))


def follow(job_id: str, out: ResultsZip, total: int, store: JobStore, deadline: float | None) -> None:
    """The other chunks' rows and pictures appended to `out` (results.zip being written from the
    job's first item) in index order as their items are recorded, while those chunks run, until it
    holds all `total` items; the caller holds the job's finish lock (`finishing`). `out` is given
    up when the job stops (cancelled, expired, failed), `deadline` (time.monotonic) passes, or an
    item is recorded without a part (its rows could not be written): maybe_finalize builds
    results.zip from the parts then."""
    jd = out.jd
    found: dict[int, tuple[Part, int]] = {}  # index -> (part, row), not appended yet
    read: set[str] = set()
    all_recorded = False  # every item was recorded when last asked
    while not out.complete(total):
        read_parts(jd, found, read)
        ready = out.next_index
        while ready in found:
            ready += 1
        recorded = (
            store.finished_items(job_id, list(range(out.next_index, ready)))
            if ready > out.next_index
            else set()
        )
        end = out.next_index
        while end in recorded:
            end += 1
        if end > out.next_index:  # a part's rows are appended once its items are recorded
            order = list(range(out.next_index, end))
            for part, start, stop in runs(found, order):
                out.add(part.pictures, part.rows.slice(start, stop - start))
            for i in order:
                del found[i]
            continue
        if all_recorded:  # its part was on disk before it was recorded: it has none
            break
        if JobState(store.record(job_id)["state"]) in (JobState.CANCELLED, JobState.EXPIRED, JobState.FAILED):
            break
        if deadline is not None and time.monotonic() > deadline:
            break
        all_recorded = sum(store.counts(job_id)) >= total
        if not all_recorded:
            time.sleep(FOLLOW_POLL_S)
    if not out.complete(total):
        out.abandon()


__all__ = ["FINISH_LOCK", "finishing", "follow", "maybe_finalize"]
