"""One bad item never sinks a batch job, and a job always ends with counts.

`process_isolated` runs a pipeline step on the engine host; an exception the host did not turn
into an item's error (a tokenizer's TypeError, a bug in a decoder) runs the step again item by
item, so each item's exception is its own error and its neighbours' results are kept. Errors of
the transport (the engine process or Redis gone) still end the call: the chunk is redelivered.

`fail_unrecorded` is the last resort of whoever runs a chunk (the in-process executor, a worker):
the items a chunk left unrecorded when it died of an exception are recorded as failed with the
reason, so that the job reaches a final state instead of staying "running" forever.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...errors import ServiceUnavailableError
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
    """`host.process`, each item's exception its own error."""
    try:
        return host.process(images, queries, controls, overlay, kind=kind)
    except TRANSPORT_ERRORS:
        raise
    except Exception as e:
        if len(images) == 1:
            log.warning("batch item failed: %s: %s", type(e).__name__, e)
            return ProcessedBatch(StepOutputs.failed(1), [error_to_wire(e)["message"]], [None], {})
        log.warning("batch step failed (%s: %s); running its items one by one", type(e).__name__, e)
    ones = [
        process_isolated(host, [image], [query], controls, overlay, kind)
        for image, query in zip(images, queries, strict=True)
    ]
    stage_ms: dict[str, float] = {}
    for one in ones:
        for name, ms in one.stage_ms.items():
            stage_ms[name] = stage_ms.get(name, 0.0) + ms
    return ProcessedBatch(
        StepOutputs.concat([one.outputs for one in ones]),
        [e for one in ones for e in one.errors],
        [x for one in ones for x in one.overlays],
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
        keys = [(it.index, it.file, it.query) for it in load_items(jd)[start:stop]]
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
