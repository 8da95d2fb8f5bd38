"""One bad item never sinks a batch job, and a job always ends with counts.

`process_isolated` runs a pipeline step on the engine host; an exception the host did not turn
into an item's error (a bug in a decoder, an engine process's failure outside its engine stage)
runs the step again item by item (`arrcoc.isolation.isolated`, the engine stage's
rule too), so each item's exception is its own error and its neighbours' results are kept. Errors
of the transport (the engine process or Redis gone) still end the call: the chunk is redelivered.

`fail_unrecorded` is the last resort of whoever runs a chunk (the in-process executor, a worker):
the items a chunk left unrecorded when it died of an exception are recorded as failed with the
reason, so that the job reaches a final state instead of staying "running" forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...errors import ServiceUnavailableError
from ...isolation import done, isolated
from ...settings import DEFAULT_OVERLAY_KIND, Settings
from ..codec import error_to_wire
from ..host.interface import ProcessedBatch, StepOutputs
from .archive import load_items
from .budget import disk_full
from .files import job_dir
from .parts import write_part
from .results import step_table
from .store import JobStore

if TYPE_CHECKING:
    from ...request import Controls
    from ..host.interface import EngineHost

log = logging.getLogger(__name__)

# the engine host or the job store unreachable: not the items' fault, the chunk is tried again
TRANSPORT_ERRORS = (ServiceUnavailableError, ConnectionError, EOFError)


def process_isolated(
    host: EngineHost,
    images: Sequence[bytes],
    queries: Sequence[str],
    controls: Controls,
    overlay: str,
    kind: str = DEFAULT_OVERLAY_KIND,
) -> ProcessedBatch:
    """`host.process`, each item's exception its own error (through `isolated`, as the engine's)."""

    def process(at: list[int]) -> Callable[[], ProcessedBatch]:
        return done(
            host.process([images[i] for i in at], [queries[i] for i in at], controls, overlay, kind=kind)
        )

    ran = isolated(process, range(len(images)), TRANSPORT_ERRORS)()
    if len(ran) == 1 and isinstance(ran[0][1], ProcessedBatch):
        return ran[0][1]
    parts = []
    for _, got in ran:
        if isinstance(got, Exception):
            log.warning("batch item failed: %s: %s", type(got).__name__, got)
            got = ProcessedBatch(StepOutputs.failed(1), [error_to_wire(got)["message"]], [None], {})
        parts.append(got)
    stage_ms: dict[str, float] = {}
    for part in parts:
        for name, ms in part.stage_ms.items():
            stage_ms[name] = stage_ms.get(name, 0.0) + ms
    return ProcessedBatch(
        StepOutputs.concat([part.outputs for part in parts]),
        [e for part in parts for e in part.errors],
        [x for part in parts for x in part.overlays],
        stage_ms,
    )


def reason_for(e: BaseException) -> str:
    """What an item left unprocessed by this exception is told."""
    if disk_full(e):
        return (
            "Not processed: the service's disk was full (results already recorded are kept);"
            " submit the job again later."
        )
    return f"Not processed: the job's worker failed ({type(e).__name__}: {e})."


def fail_unrecorded(
    job_id: str, start: int, stop: int, store: JobStore, settings: Settings, reason: str
) -> int:
    """Record items [start, stop) that are not recorded yet as failed with `reason`; how many.
    Their rows go in a part when the disk takes it, else the job store alone records them."""
    jd = job_dir(settings, job_id)
    try:
        keys = [(it.index, it.file, it.query) for it in load_items(jd, start, stop)]
    except Exception as e:  # noqa: BLE001 -- the job's files are what failed: the items by index alone
        log.warning("job %s: its items cannot be read (%s)", job_id, e)
        keys = [(i, "", "") for i in range(start, stop)]
    recorded = store.finished_items(job_id, [k[0] for k in keys])
    left = [k for k in keys if k[0] not in recorded]
    if not left:
        return 0
    try:
        (jd / "results").mkdir(exist_ok=True)
        none = [None] * len(left)
        write_part(
            jd, step_table(left, StepOutputs.failed(len(left)), [reason] * len(left), none), none, none
        )
    except Exception as e:  # noqa: BLE001 -- a full disk, a row that cannot be written: the store still records them
        log.warning("job %s: could not write the failed items' rows (%s)", job_id, e)
    store.mark_items(job_id, [(k[0], reason) for k in left])
    return len(left)
