"""Faults, for real: a worker SIGKILLed in the middle of a batch job, and Redis restarted under a
running job. Uses its own redis-server (AOF on, noeviction: what compose runs) on a free port."""

from __future__ import annotations

import signal
import threading
import time
import zipfile

import pytest
from helpers import make_zip, merged, png_bytes, result_rows, seeded_weights

from arrcoc.bench.processes import RedisServer, Worker, worker_env
from arrcoc.errors import ArrcocError, ServiceUnavailableError
from arrcoc.service.jobs.types import JobState
from arrcoc.settings import default_settings

SETTINGS = {
    "engine": {"buckets": "[1,2,4]"},
    "jobs": {"visibility_timeout_s": "6", "max_redeliveries": "3"},
    "service": {"redis_timeout_s": "2"},
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    redis = RedisServer(root / "redis")
    settings = merged(SETTINGS, {"engine": {"weights": str(seeded_weights(root / "w.safetensors"))}})
    env = worker_env(redis.url, root / "data", **settings)
    started: list[Worker] = []
    servers = [redis]

    def start_worker() -> Worker:
        w = Worker(env, root / f"worker{len(started)}.log", concurrency=3)
        started.append(w)
        return w.ready(300)

    def executor(**overrides):
        from arrcoc.service.client.celery_executor import CeleryExecutor

        service = {"service": {"broker_url": redis.url, "data_dir": root / "data"}}
        return CeleryExecutor(default_settings(**merged(settings, service, overrides)))

    try:
        yield {
            "root": root,
            "redis": servers,
            "start_worker": start_worker,
            "executor": executor,
            "env": env,
            "workers": started,
        }
    finally:
        for w in started:
            w.stop()
        for r in servers:
            r.stop()


def wait_for(ex, job, predicate, timeout):
    t0 = time.monotonic()
    st = None
    while time.monotonic() - t0 < timeout:
        try:
            st = ex.status(job)
        except ServiceUnavailableError:
            st = None
        if st is not None and predicate(st):
            return st
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s; last status {st}")


def assert_every_item_exactly_once(ex, job, total):
    with zipfile.ZipFile(ex.batch_results(job)) as zf:
        rows = result_rows(zf)
        assert sorted(r["index"] for r in rows) == list(range(total))
        assert all(r["ok"] for r in rows)


@pytest.mark.parametrize("chunk_items", [256, 16], ids=["one-chunk", "chunks"])
def test_sigkill_mid_batch_then_new_worker_completes_every_item_once(rig, chunk_items):
    """One chunk, or ten: then the killed worker may have been writing results.zip while the other
    chunks ran (the first chunk's), which the job's next finisher does instead."""
    worker = rig["start_worker"]()
    ex = rig["executor"](batching={"chunk_items": chunk_items})
    total = 160  # long enough that the kill lands mid-job (8 items a step; a step takes tens of ms here)
    job = ex.submit_batch(make_zip({f"{i:03d}.png": png_bytes(i) for i in range(total)}), "the sky")
    # past the first chunk of 16: its worker is writing results.zip as the second one runs
    st = wait_for(ex, job, lambda s: s.done >= 20 or s.state.finished, 120)
    assert not st.state.finished, "the job finished before the kill; make it longer"
    worker.kill(signal.SIGKILL)
    worker.p.wait(10)
    at_kill = ex.status(job)
    assert at_kill.done < total and at_kill.state == JobState.RUNNING
    rig["start_worker"]()
    st = wait_for(ex, job, lambda s: s.state.finished, 180)
    assert (st.state, st.done, st.failed) == (JobState.DONE, total, 0), st
    assert_every_item_exactly_once(ex, job, total)
    ex.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_redis_restart_mid_job_leaves_the_worker_serving_and_no_call_hangs(rig, sig):
    """Redis stopped (SIGTERM: it writes its AOF; SIGKILL: the AOF as last synced) while the worker
    runs chunks, back 3 s later: the job ends done with each item once, the worker is still running,
    and a job submitted after the restart is done too."""
    redis = rig["redis"][-1]
    worker = next((w for w in reversed(rig["workers"]) if w.alive()), None) or rig["start_worker"]()
    ex = rig["executor"]()
    total = 160
    job = ex.submit_batch(make_zip({f"{i:03d}.png": png_bytes(50 + i) for i in range(total)}), "a face")
    st = wait_for(ex, job, lambda s: s.done >= 4 or s.state.finished, 120)
    assert not st.state.finished, "the job finished before Redis stopped; make it longer"
    redis.kill(sig)
    redis.p.wait(10)
    for call in (lambda: ex.status(job), lambda: ex.infer(png_bytes(1), "q", timeout=5)):
        t0 = time.monotonic()
        with pytest.raises(ServiceUnavailableError):
            call()
        assert time.monotonic() - t0 < 8, "a client call hung on a dead Redis"
    time.sleep(max(0.0, 3 - (time.monotonic() - t0)))
    rig["redis"].append(RedisServer(redis.dir, redis.port))  # same port, same AOF
    st = wait_for(ex, job, lambda s: s.state.finished, 240)
    assert (st.state, st.done, st.failed) == (JobState.DONE, total, 0), st
    assert_every_item_exactly_once(ex, job, total)
    assert worker.alive(), f"the worker exited after the restart: {worker.text()[-3000:]}"
    after = ex.submit_batch(make_zip({f"{i:02d}.png": png_bytes(400 + i) for i in range(8)}), "a face")
    st = wait_for(ex, after, lambda s: s.state.finished, 180)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 8, 0), st
    assert worker.alive() and "Unrecoverable error" not in worker.text()
    ex.close()


def test_interactive_request_that_keeps_killing_workers_fails_with_a_reason(rig):
    """acks_late + reject-on-worker-lost give a request whose worker died to the next worker; after
    ARRCOC_JOBS__MAX_REDELIVERIES (3) deaths the next delivery answers with a reason instead of running it."""
    import redis as redis_py

    for w in rig["workers"]:  # nobody else may take the request
        w.stop()
    r = redis_py.Redis.from_url(rig["redis"][-1].url)
    # one request waits 5 s in the batcher for company (even alone): a window to kill its worker in
    slow = rig["env"] | {
        "ARRCOC_BATCHING__MAX_DELAY_MS": "5000",
        "ARRCOC_BATCHING__MAX_SIZE": "4",
        "ARRCOC_BATCHING__IDLE_WAIT": "1",
    }
    ex = rig["executor"]()
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["result"] = ex.infer(png_bytes(7), "the sky", timeout=300)
        except Exception as e:  # noqa: BLE001 -- asserted below
            outcome["error"] = e

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    for delivery in (1, 2, 3):
        w = Worker(slow, rig["root"] / f"crash{delivery}.log", concurrency=3)
        rig["workers"].append(w)
        w.ready(300)
        t0 = time.monotonic()
        while not any(int(r.get(k) or 0) >= delivery for k in r.scan_iter("arrcoc:attempts:*")):
            assert time.monotonic() - t0 < 90, f"delivery {delivery} never reached a worker"
            time.sleep(0.1)
        w.kill(signal.SIGKILL)
        w.p.wait(10)
    rig["start_worker"]()
    caller.join(150)
    assert not caller.is_alive(), "the caller never heard back"
    err = outcome.get("error")
    assert isinstance(err, ArrcocError) and "stopped the worker 3 times" in str(err), outcome
    ex.close()
