"""The job store: state, progress and per-item outcomes of batch and benchmark jobs.

Two implementations with one contract: `RedisJobStore` (hashes and sets with a TTL, shared by the
web side and every worker; survives a browser refresh and a Redis restart with AOF) and
`MemoryJobStore` (the in-process executor). Marking an item is idempotent — a redelivered chunk
cannot count an item twice. An index of job ids -> expiry time outlives the jobs themselves, so
a job whose TTL passed reports "expired", and an id never issued reports "unknown".
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from ...errors import JobError, ServiceUnavailableError
from ...tuning import LOST_AFTER_BEATS, TOMBSTONE_S
from .types import JobKind, JobState, JobStatus


class JobStore(ABC):
    _stage_lock = threading.Lock()  # add_stage_ms reads, adds and writes back

    @abstractmethod
    def create(self, job_id: str, kind: JobKind, total: int, ttl_s: int, fields: dict[str, Any]) -> None: ...

    @abstractmethod
    def _fields(self, job_id: str) -> dict[str, str]: ...

    @abstractmethod
    def _expires_at(self, job_id: str) -> float | None: ...

    @abstractmethod
    def set_fields(self, job_id: str, **fields: Any) -> None: ...

    @abstractmethod
    def set_state(
        self,
        job_id: str,
        state: JobState,
        message: str | None = None,
        expect: tuple[JobState, ...] | None = None,
    ) -> bool:
        """Set the state (only from one of `expect`, when given); True if it was set."""

    @abstractmethod
    def mark_item(self, job_id: str, index: int, error: str | None = None) -> bool:
        """Record an item as done (error None) or failed; False if it was already recorded."""

    @abstractmethod
    def item_finished(self, job_id: str, index: int) -> bool: ...

    @abstractmethod
    def counts(self, job_id: str) -> tuple[int, int]:
        """(done, failed)"""

    @abstractmethod
    def failed_items(self, job_id: str) -> dict[int, str]: ...

    @abstractmethod
    def attempt(self, job_id: str, index: int) -> int:
        """Count one more attempt at an item (redeliveries after a worker died); returns the count."""

    @abstractmethod
    def jobs_ahead(self, job_id: str, kind: JobKind, created_at: float) -> int:
        """Unfinished jobs of this kind created before this one: its place in the queue."""

    # many items at once: a batch job records a step of items in one call (one Redis round trip)
    def mark_items(self, job_id: str, marks: list[tuple[int, str | None]]) -> None:
        for index, error in marks:
            self.mark_item(job_id, index, error)

    def finished_items(self, job_id: str, indices: list[int]) -> set[int]:
        return {i for i in indices if self.item_finished(job_id, i)}

    def attempt_items(self, job_id: str, indices: list[int]) -> list[int]:
        return [self.attempt(job_id, i) for i in indices]

    @abstractmethod
    def attempts_of(self, job_id: str, indices: list[int]) -> list[int]:
        """How many times each item was handed to an engine without being recorded (0: never)."""

    def add_stage_ms(self, job_id: str, stage_ms: dict[str, float]) -> None:
        """Add a chunk's time per stage to the job's (`stage_ms` field: the end-to-end breakdown)."""
        with self._stage_lock:
            total = json.loads(self._fields(job_id).get("stage_ms") or "{}")
            for name, ms in stage_ms.items():
                total[name] = round(total.get(name, 0.0) + ms, 3)
            self.set_fields(job_id, stage_ms=total)

    def lost_note(self, job_id: str) -> str:
        """What to say of a chunk whose worker stopped beating ("" when none did; workers beat
        only through Redis)."""
        return ""

    def record(self, job_id: str) -> dict[str, str]:
        """The job's fields; {"state": "expired"} past its TTL; JobError for an unknown id."""
        fields = self._fields(job_id)
        if fields:
            return fields
        expires = self._expires_at(job_id)
        if expires is None:
            raise JobError(
                f"No job {job_id!r} that you may read: a job is shown only to whoever submitted it (the same "
                "browser, the same gradio_client Client or the same API token), for a limited time; check the id."
            )
        if expires <= time.time() + 1.0:
            return {"state": JobState.EXPIRED.value, "message": "The job's results expired and were deleted."}
        return {"state": JobState.FAILED.value, "message": "The job's state was lost (was Redis flushed?)."}

    def check_owner(self, job_id: str, owner: str | None) -> None:
        """A job made by another owner (session or token) is "no such job" to this one; owner None:
        no check (the library, or a CLI with direct access to Redis)."""
        if owner is None:
            return
        fields = self._fields(job_id)
        if fields and not hmac.compare_digest(fields.get("owner", "").encode(), owner.encode()):
            raise JobError(
                f"No job {job_id!r} that you may read: a job is shown only to whoever submitted it (the same "
                "browser, the same gradio_client Client or the same API token), for a limited time; check the id."
            )

    def cancel(self, job_id: str) -> None:
        """Cancel a pending or running job (a finished one stays as it is)."""
        if JobState(self.record(job_id)["state"]) == JobState.EXPIRED:
            raise JobError(f"Job {job_id} expired; there is nothing to cancel.")
        self.set_state(
            job_id, JobState.CANCELLED, "Cancelled by the user.", expect=(JobState.PENDING, JobState.RUNNING)
        )

    def status(self, job_id: str) -> JobStatus:
        f = self.record(job_id)
        state = JobState(f["state"])
        done, failed = self.counts(job_id) if state != JobState.EXPIRED else (0, 0)
        kind, created = JobKind(f.get("kind", "batch")), float(f.get("created_at", 0))
        position = self.jobs_ahead(job_id, kind, created) if state == JobState.PENDING else None
        lost = self.lost_note(job_id) if state == JobState.RUNNING else ""
        message = " ".join(m for m in (lost, f.get("message", ""), f.get("skipped", "")) if m)
        return JobStatus(
            job_id=job_id,
            kind=kind,
            state=state,
            total=int(f.get("total", 0)),
            done=done,
            failed=failed,
            message=message,
            queue_position=position,
            created_at=created,
            updated_at=float(f.get("updated_at", 0)),
        )


def _encode(fields: dict[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}


class MemoryJobStore(JobStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, dict[str, Any]] = {}
        self._expiry: dict[str, float] = {}

    def _live(self, job_id: str) -> dict[str, Any] | None:
        exp = self._expiry.get(job_id)
        if exp is not None and exp <= time.time():
            self._jobs.pop(job_id, None)
        return self._jobs.get(job_id)

    def create(self, job_id, kind, total, ttl_s, fields):
        now = time.time()
        with self._lock:
            self._expiry[job_id] = now + ttl_s
            base = {
                "kind": kind.value,
                "state": JobState.PENDING.value,
                "total": str(total),
                "created_at": str(now),
                "updated_at": str(now),
                "expires_at": str(now + ttl_s),
            }
            self._jobs[job_id] = {
                "fields": base | _encode(fields),
                "done": set(),
                "failed": {},
                "attempts": {},
            }

    def _fields(self, job_id):
        with self._lock:
            job = self._live(job_id)
            return dict(job["fields"]) if job else {}

    def _expires_at(self, job_id):
        return self._expiry.get(job_id)

    def set_fields(self, job_id, **fields):
        with self._lock:
            if job := self._live(job_id):
                job["fields"].update(_encode(fields) | {"updated_at": str(time.time())})

    def set_state(self, job_id, state, message=None, expect=None):
        with self._lock:
            job = self._live(job_id)
            if not job or (expect and job["fields"]["state"] not in {e.value for e in expect}):
                return False
            job["fields"].update(state=state.value, updated_at=str(time.time()))
            if message is not None:
                job["fields"]["message"] = message
            return True

    def mark_item(self, job_id, index, error=None):
        with self._lock:
            job = self._live(job_id)
            if not job or index in job["done"] or index in job["failed"]:
                return False
            if error is None:
                job["done"].add(index)
            else:
                job["failed"][index] = error
            return True

    def item_finished(self, job_id, index):
        with self._lock:
            job = self._live(job_id)
            return bool(job) and (index in job["done"] or index in job["failed"])

    def counts(self, job_id):
        with self._lock:
            job = self._live(job_id)
            return (len(job["done"]), len(job["failed"])) if job else (0, 0)

    def failed_items(self, job_id):
        with self._lock:
            job = self._live(job_id)
            return dict(job["failed"]) if job else {}

    def jobs_ahead(self, job_id, kind, created_at):
        unfinished = {JobState.PENDING.value, JobState.RUNNING.value}
        with self._lock:
            return sum(
                1
                for other, job in list(self._jobs.items())
                if other != job_id
                and self._live(other)
                and job["fields"]["kind"] == kind.value
                and job["fields"]["state"] in unfinished
                and float(job["fields"]["created_at"]) < created_at
            )

    def attempt(self, job_id, index):
        with self._lock:
            job = self._live(job_id)
            if not job:
                return 1
            job["attempts"][index] = job["attempts"].get(index, 0) + 1
            return job["attempts"][index]

    def attempts_of(self, job_id, indices):
        with self._lock:
            job = self._live(job_id)
            return [job["attempts"].get(i, 0) if job else 0 for i in indices]


# compare-and-set of the state field: KEYS[1] job hash; ARGV: new state, time, "=message" or "" (keep), expected...
_SET_STATE = """
if redis.call('exists', KEYS[1]) == 0 then return 0 end
if #ARGV > 3 then
  local cur = redis.call('hget', KEYS[1], 'state')
  local ok = false
  for i = 4, #ARGV do if cur == ARGV[i] then ok = true end end
  if not ok then return 0 end
end
redis.call('hset', KEYS[1], 'state', ARGV[1], 'updated_at', ARGV[2])
if ARGV[3] ~= '' then redis.call('hset', KEYS[1], 'message', string.sub(ARGV[3], 2)) end
return 1
"""

# idempotent item mark: KEYS done set, failed hash; ARGV index, error|""
_MARK = """
if redis.call('sismember', KEYS[1], ARGV[1]) == 1 or redis.call('hexists', KEYS[2], ARGV[1]) == 1 then
  return 0
end
if ARGV[2] == '' then redis.call('sadd', KEYS[1], ARGV[1]) else redis.call('hset', KEYS[2], ARGV[1], ARGV[2]) end
redis.call('expire', KEYS[1], ARGV[3]); redis.call('expire', KEYS[2], ARGV[3])
return 1
"""


def redis_client(url: str, timeout_s: float = 5.0, decode_responses: bool = True):
    """A Redis client whose calls fail after `timeout_s` instead of hanging on a dead server
    (text for the job store; `decode_responses=False` for image bytes)."""
    import redis

    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=decode_responses,
        health_check_interval=30,
    )


class RedisJobStore(JobStore):
    def __init__(self, client, prefix: str = "arrcoc"):
        self.r = client
        self.prefix = prefix
        self._set_state = client.register_script(_SET_STATE)
        self._mark = client.register_script(_MARK)

    def key(self, job_id: str, part: str = "") -> str:
        return f"{self.prefix}:job:{job_id}" + (f":{part}" if part else "")

    @property
    def index_key(self) -> str:
        return f"{self.prefix}:jobs"

    def queue_key(self, kind: JobKind) -> str:
        """Sorted set of unfinished jobs of a kind, scored by creation time."""
        return f"{self.prefix}:queue:{kind.value}"

    def _call(self, fn, *args, **kwargs):
        import redis

        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            raise ServiceUnavailableError(
                f"Redis did not answer ({e}); is it running? Retry in a moment."
            ) from e

    def _ttl(self, job_id: str) -> int:
        ttl = self._call(self.r.ttl, self.key(job_id))
        return max(int(ttl), 1) if ttl and ttl > 0 else 3600

    def create(self, job_id, kind, total, ttl_s, fields):
        now = time.time()
        base = {
            "kind": kind.value,
            "state": JobState.PENDING.value,
            "total": str(total),
            "created_at": str(now),
            "updated_at": str(now),
            "expires_at": str(now + ttl_s),
        }
        pipe = self.r.pipeline()
        pipe.hset(self.key(job_id), mapping=base | _encode(fields))
        pipe.expire(self.key(job_id), ttl_s)
        pipe.zadd(self.index_key, {job_id: now + ttl_s})
        pipe.zremrangebyscore(self.index_key, "-inf", now - TOMBSTONE_S)
        pipe.zadd(self.queue_key(kind), {job_id: now})
        pipe.zremrangebyscore(self.queue_key(kind), "-inf", now - ttl_s)  # jobs that expired unfinished
        self._call(pipe.execute)

    def _fields(self, job_id):
        return self._call(self.r.hgetall, self.key(job_id))

    def _expires_at(self, job_id):
        score = self._call(self.r.zscore, self.index_key, job_id)
        return None if score is None else float(score)

    def set_fields(self, job_id, **fields):
        key = self.key(job_id)
        if self._call(self.r.exists, key):
            self._call(self.r.hset, key, mapping=_encode(fields) | {"updated_at": str(time.time())})

    def set_state(self, job_id, state, message=None, expect=None):
        keep = "" if message is None else "=" + message
        args = [state.value, str(time.time()), keep] + [e.value for e in (expect or ())]
        changed = bool(self._call(self._set_state, keys=[self.key(job_id)], args=args))
        if changed and state.finished:
            for kind in JobKind:
                self._call(self.r.zrem, self.queue_key(kind), job_id)
        return changed

    # -- liveness of running chunks: a worker beats for each chunk it runs (worker/state.py) ------

    def chunk_alive(self, job_id: str, start: int, stop: int, every_s: float, resume_s: float) -> None:
        key = self.key(job_id, "alive")
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(
            key,
            mapping={f"{start}-{stop}": str(time.time()), "_every": str(every_s), "_resume": str(resume_s)},
        )
        pipe.expire(key, self._ttl(job_id))
        self._call(pipe.execute)

    def chunk_over(self, job_id: str, start: int, stop: int) -> None:
        self._call(self.r.hdel, self.key(job_id, "alive"), f"{start}-{stop}")

    def lost_note(self, job_id):
        marks = self._call(self.r.hgetall, self.key(job_id, "alive"))
        try:
            every, resume = float(marks.pop("_every", 0)), float(marks.pop("_resume", 0))
            now = time.time()
            lost = sorted(
                (
                    tuple(int(x) for x in span.split("-"))
                    for span, at in marks.items()
                    if now - float(at) > LOST_AFTER_BEATS * every
                )
            )
        except ValueError:
            return ""
        if not lost:
            return ""
        start, stop = lost[0]
        more = f" (and {len(lost) - 1} more chunks)" if len(lost) > 1 else ""
        return (
            f"A worker was lost while it ran items {start}-{stop - 1}{more}; resuming: another worker takes"
            f" them up within about {resume:.0f} s."
        )

    def jobs_ahead(self, job_id, kind, created_at):
        return int(self._call(self.r.zcount, self.queue_key(kind), "-inf", f"({created_at!r}"))

    def mark_item(self, job_id, index, error=None):
        keys = [self.key(job_id, "done"), self.key(job_id, "failed")]
        args = [str(index), error or "", str(self._ttl(job_id))]
        if error == "":
            args[1] = "failed"
        return bool(self._call(self._mark, keys=keys, args=args))

    def item_finished(self, job_id, index):
        pipe = self.r.pipeline()
        pipe.sismember(self.key(job_id, "done"), str(index))
        pipe.hexists(self.key(job_id, "failed"), str(index))
        return any(self._call(pipe.execute))

    def counts(self, job_id):
        pipe = self.r.pipeline()
        pipe.scard(self.key(job_id, "done"))
        pipe.hlen(self.key(job_id, "failed"))
        done, failed = self._call(pipe.execute)
        return int(done), int(failed)

    def failed_items(self, job_id):
        return {int(k): v for k, v in self._call(self.r.hgetall, self.key(job_id, "failed")).items()}

    def mark_items(self, job_id, marks):
        if not marks:
            return
        keys = [self.key(job_id, "done"), self.key(job_id, "failed")]
        ttl = str(self._ttl(job_id))
        pipe = self.r.pipeline(transaction=False)
        for index, error in marks:
            self._mark(
                keys=keys, args=[str(index), error or ("failed" if error == "" else ""), ttl], client=pipe
            )
        self._call(pipe.execute)

    def finished_items(self, job_id, indices):
        # only the indices asked about: a chunk's check costs the same at the start of a job as at its end
        indices = list(indices)
        if not indices:
            return set()
        names = [str(i) for i in indices]
        pipe = self.r.pipeline(transaction=False)
        pipe.smismember(self.key(job_id, "done"), names)
        pipe.hmget(self.key(job_id, "failed"), names)
        done, failed = self._call(pipe.execute)
        return {i for i, d, f in zip(indices, done, failed, strict=True) if d or f is not None}

    def attempt_items(self, job_id, indices):
        if not indices:
            return []
        key = self.key(job_id, "attempts")
        pipe = self.r.pipeline(transaction=False)
        for i in indices:
            pipe.hincrby(key, str(i), 1)
        pipe.expire(key, self._ttl(job_id))
        return [int(n) for n in self._call(pipe.execute)[:-1]]

    def attempts_of(self, job_id, indices):
        if not indices:
            return []
        counts = self._call(self.r.hmget, self.key(job_id, "attempts"), [str(i) for i in indices])
        return [int(n or 0) for n in counts]

    def attempt(self, job_id, index):
        key = self.key(job_id, "attempts")
        pipe = self.r.pipeline()
        pipe.hincrby(key, str(index), 1)
        pipe.expire(key, self._ttl(job_id))
        return int(self._call(pipe.execute)[0])
