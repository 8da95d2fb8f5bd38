"""A worker that runs but cannot serve says so: its health check fails naming the reason, requests
hear the reason at once, and batch chunks it cannot read go back to a worker that can. Real
redis-server (its own port, AOF on), real worker processes, the real `arrcoc-healthcheck`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zipfile

import pytest
from helpers import make_zip, png_bytes, result_rows, seeded_weights, wait_for

from arrcoc.bench.processes import REPO, RedisServer, Worker, worker_env
from arrcoc.errors import WeightsError
from arrcoc.service.jobs.types import JobState
from arrcoc.settings import default_settings

HEALTHCHECK = REPO / "docker" / "healthcheck.py"


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


def celery_ready(worker: Worker, timeout: float = 240.0) -> Worker:
    """Until the Celery worker consumes (it logs '<name> ready.'), whatever its engine did."""
    wait_for(
        lambda: " ready." in worker.text() or not worker.alive(),
        timeout,
        "the worker consuming",
        every=0.5,
    )
    assert worker.alive(), worker.text()[-3000:]
    return worker


def healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess:
    """`arrcoc-healthcheck worker` as compose runs it in the worker's container (node arrcoc@<host>)."""
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_a_model_that_cannot_load_fails_the_healthcheck_and_requests_hear_why_at_once(
    redis, workers, tmp_path, monkeypatch
):
    from arrcoc.service.client.celery_executor import CeleryExecutor
    from arrcoc.settings import get_settings
    from demo import service

    # arrcoc-clip-b16's weights come from the hub: offline and not cached, they cannot load
    env = worker_env(redis.url, tmp_path / "data", engine={"variant": "arrcoc-clip-b16"}) | {
        "HF_HUB_OFFLINE": "1"
    }
    workers.append(Worker(env, tmp_path / "worker.log", concurrency=3, name="arrcoc@%h"))
    celery_ready(workers[0])

    check = healthcheck(env)
    assert check.returncode == 1, (check.stdout, check.stderr)
    assert "could not load" in check.stderr and "arrcoc-clip-b16" in check.stderr, check.stderr
    assert "arrcoc-texture" in check.stderr, "the reason names the variant that works offline"

    ex = CeleryExecutor(default_settings(service={"broker_url": redis.url, "data_dir": tmp_path / "data"}))
    try:
        for _ in range(3):
            t0 = time.monotonic()
            with pytest.raises(WeightsError, match="Could not load CLIP weights") as err:
                ex.infer(png_bytes(1), "a cat", timeout=60)
            assert time.monotonic() - t0 < 10, "the request waited instead of hearing the reason"
            assert "No worker answered" not in str(err.value)
        assert any("could not load" in p for p in ex.worker_problems()), ex.worker_problems()
        with monkeypatch.context() as m:  # the demo's page says it too
            m.setenv("ARRCOC_SERVICE__BROKER_URL", redis.url)
            get_settings.cache_clear()
            service.set_executor(ex)
            notice = service.worker_notice()
        assert "cannot serve" in notice and "Could not load CLIP weights" in notice, notice
    finally:
        service.set_executor(None)
        get_settings.cache_clear()
        ex.close()
    # the load is not tried again for every request: the reason recorded at start is answered
    assert workers[0].text().count("the model could not load") == 1


def test_a_worker_that_cannot_read_a_jobs_data_gives_its_chunks_back_and_says_why(redis, workers, tmp_path):
    from arrcoc.service.client.celery_executor import CeleryExecutor

    weights = str(seeded_weights(tmp_path / "w.safetensors"))
    settings = {"engine": {"weights": weights, "buckets": "[1,2,4]"}, "batching": {"chunk_items": "4"}}
    good_dir, wrong_dir = tmp_path / "shared-data", tmp_path / "not-mounted"
    wrong_env = worker_env(redis.url, wrong_dir, **settings)
    # the worker with the wrong data directory runs alone first: every chunk reaches it
    wrong = Worker(wrong_env, tmp_path / "wrong.log", concurrency=3, name="arrcoc@%h")
    workers.append(wrong)
    wrong.ready(timeout=300)
    ex = CeleryExecutor(
        default_settings(
            service={"broker_url": redis.url, "data_dir": good_dir},
            engine={"weights": weights},
            batching={"chunk_items": 4},
        )
    )
    try:
        total = 24
        job = ex.submit_batch(make_zip({f"{i:02d}.png": png_bytes(i) for i in range(total)}), "the sky")
        wait_for(lambda: wrong.text().count("gives their chunks back") >= 2, 120, "chunks given back")
        st = ex.status(job)
        assert (st.done, st.failed) == (0, 0) and not st.state.finished, st

        check = healthcheck(wrong_env)
        assert check.returncode == 1, (check.stdout, check.stderr)
        assert "cannot read batch jobs' data" in check.stderr and str(wrong_dir) in check.stderr
        assert any("cannot read batch jobs' data" in p for p in ex.worker_problems())

        good = Worker(worker_env(redis.url, good_dir, **settings), tmp_path / "good.log", concurrency=3)
        workers.append(good)
        good.ready(timeout=300)
        st = wait_for(lambda: (s := ex.status(job)).state.finished and s, 240, "the job finished")
        assert (st.state, st.done, st.failed) == (JobState.DONE, total, 0), st
        with zipfile.ZipFile(ex.batch_results(job)) as zf:
            rows = result_rows(zf)
        assert sorted(r["index"] for r in rows) == list(range(total)) and all(r["ok"] for r in rows)
        assert wrong.alive() and good.alive()
        assert healthcheck(wrong_env).returncode == 1, "still unhealthy: it still cannot read the data"
    finally:
        ex.close()
    assert not os.path.exists(wrong_dir / "jobs" / job), "the wrong worker wrote nothing of the job"


def test_a_failed_load_is_answered_at_once_then_tried_again_after_a_while(monkeypatch):
    """The retry rule of worker/state.py on a stand-in engine host whose first load fails (a real
    one cannot be made to fail and then succeed on demand)."""
    import uuid

    from helpers import BROKER

    import worker.state
    from arrcoc.service.client.queue import problems_key
    from worker.state import WorkerState

    class FlakyHost:
        loads = 0

        def warm(self) -> None:
            self.loads += 1
            if self.loads == 1:
                raise WeightsError("the hub is out of reach")

        def close(self) -> None:
            pass

    state = WorkerState()
    state.configure(
        default_settings(service={"broker_url": BROKER, "redis_prefix": f"health-{uuid.uuid4().hex[:8]}"})
    )
    state.node = "flaky@test"
    host = state._host = FlakyHost()
    key = problems_key(state.settings.service.redis_prefix, state.node)
    try:
        state.warm()
        assert state.problems() == ["its model (arrcoc-texture) could not load: the hub is out of reach"]
        assert state.raw.ttl(key) > 0  # published for clients, expiring unless renewed
        for _ in range(3):
            with pytest.raises(WeightsError, match="out of reach"):
                state.loaded_host()
        assert host.loads == 1, "answered from the record, not loaded again"
        monkeypatch.setattr(worker.state, "LOAD_RETRY_S", 0.0)
        assert state.loaded_host() is host and host.loads == 2
        assert state.problems() == [] and not state.raw.exists(key)
    finally:
        state.close()
