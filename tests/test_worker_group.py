"""`arrcoc worker --processes N` for real: two Celery processes feeding two engine processes
(ARRCOC_ENGINE__PROCESSES) on one device, on their own redis-server. Results equal the in-process
ones whichever engine process served them, batches form there, a benchmark holds the device in
both engine processes, an engine process that dies is started again alone, and a Celery process's
death takes the group down. (One engine process fed by several
Celery processes: tests/test_worker_faults.py and tests/test_abuse_worker.py.)"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time
import zipfile
from pathlib import Path

import pytest
from helpers import assert_same_result, make_zip, merged, png_bytes, result_rows, seeded_weights, wait_for

from arrcoc.bench.processes import REPO, RedisServer, Worker, child_pids, proc_stat, worker_env
from arrcoc.errors import InvalidInputError
from arrcoc.request import Controls
from arrcoc.service.jobs.types import BenchRequest, JobState
from arrcoc.settings import default_settings

SETTINGS = {
    "engine": {"buckets": "[1,2,4,8]", "worker_processes": "2", "processes": "2"},
    "batching": {"max_size": "8", "max_delay_ms": "50"},
}


def alive(pid: int) -> bool:
    try:
        state = proc_stat(pid)[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent has not collected it yet


def wait_until(predicate, timeout: float, what: str) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    root = tmp_path_factory.mktemp("group")
    redis = RedisServer(root / "redis")
    settings = merged(SETTINGS, {"engine": {"weights": str(seeded_weights(root / "w.safetensors"))}})
    env = worker_env(redis.url, root / "data", **settings)
    workers: list[Worker] = []

    def start() -> Worker:
        w = Worker(env, root / f"group{len(workers)}.log")
        workers.append(w)
        return w.ready(300)

    def settings_for(**overrides):
        """The group's settings (from the strings its environment carries), `overrides` by group."""
        service = {"service": {"broker_url": redis.url, "data_dir": root / "data"}}
        return default_settings(**merged(settings, service, overrides))

    try:
        yield {"start": start, "settings": settings_for, "worker": start()}
    finally:
        for w in workers:
            w.stop()
        redis.stop()


@pytest.fixture(scope="module")
def celery_ex(rig):
    from arrcoc.service.client.celery_executor import CeleryExecutor

    ex = CeleryExecutor(rig["settings"]())
    yield ex
    ex.close()


def test_results_equal_inprocess_and_batches_span_both_processes(rig, celery_ex):
    from arrcoc.service.client.inprocess import InProcessExecutor

    local = InProcessExecutor(rig["settings"](service={"broker_url": None}))
    try:
        image = (REPO / "arrcoc" / "examples" / "coffee.jpg").read_bytes()
        controls = Controls(k=16, token_budget=2048, scale_perspectival=0.5)
        assert_same_result(
            celery_ex.infer(image, "the red mug", controls), local.infer(image, "the red mug", controls)
        )
    finally:
        local.close()
    with pytest.raises(
        InvalidInputError, match="K must be"
    ):  # checked in a Celery process, told to the caller
        celery_ex.infer(png_bytes(0), "q", Controls(k=0))

    image = png_bytes(3)
    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: celery_ex.infer(image, "the sky", timeout=120), range(32)))
    assert max(r.bucket for r in results) > 1, [r.bucket for r in results]

    # both Celery processes took requests, each feeding its own engine process: the results are
    # the same whichever engine process served them
    def served() -> dict[str, int] | None:  # asked again until both answer: a reply can come late
        stats = celery_ex.app.control.inspect(timeout=10.0, limit=2).stats() or {}
        counts = {node: s.get("total", {}).get("arrcoc.infer", 0) for node, s in stats.items()}
        return counts if len(counts) == 2 else None

    counts = wait_for(served, 120, "both Celery processes reported", every=0.5)
    assert all(n > 0 for n in counts.values()), counts
    for r in results[1:]:
        assert_same_result(r, results[0])


def test_batch_job_and_benchmark_through_the_group(celery_ex):
    files = {f"p{i:02d}.png": png_bytes(200 + i) for i in range(12)} | {
        "broken.png": b"\x89PNG\r\n\x1a\n cut"
    }
    job = celery_ex.submit_batch(make_zip(files), "the sky")
    t0 = time.monotonic()
    while not (st := celery_ex.status(job)).state.finished and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 12, 1), st
    with zipfile.ZipFile(celery_ex.batch_results(job)) as zf:
        assert len(result_rows(zf)) == 13

    bench = celery_ex.submit_bench(
        BenchRequest(
            variants=("arrcoc-texture",),
            backends=("eager",),
            buckets=(1,),
            iterations=2,
            warmup=1,
            device="cpu",
        )
    )
    t0 = time.monotonic()
    while not (st := celery_ex.status(bench)).state.finished and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    assert st.state == JobState.DONE, st.message
    report = celery_ex.bench_report(bench)
    held = report["device_exclusive"]
    assert report["results"] and held["held_ms"] > 0
    # the other engine process held the device throughout too (its batches waited)
    (other,) = held["engine_processes_held"]
    assert other["held_ms"] >= held["held_ms"], held


def test_engine_killed_is_started_again_alone(rig, celery_ex):
    w = rig["worker"]
    first, second, *fronts = child_pids(w.p.pid)  # the engine processes start first
    assert len(fronts) == 2
    os.kill(second, signal.SIGKILL)
    # the group stays: requests meanwhile go to the other engine process, the killed one comes back
    assert celery_ex.infer(png_bytes(11), "the sky", timeout=60).relevance is not None
    wait_until(
        lambda: len(child_pids(w.p.pid)) == 4 and second not in child_pids(w.p.pid),
        30,
        "the engine started again",
    )
    assert w.alive() and all(alive(p) for p in [first, *fronts])
    assert "starting it again" in w.text()


def test_celery_process_killed_stops_the_whole_group(rig):
    w = rig["worker"]
    members = child_pids(w.p.pid)
    front, *others = [p for p in members if b"engine_process" not in Path(f"/proc/{p}/cmdline").read_bytes()]
    others += [p for p in members if p not in (front, *others)]
    os.kill(front, signal.SIGKILL)
    w.p.wait(60)  # the supervisor stops the others and exits: compose restarts the group
    assert w.p.returncode != 0
    wait_until(lambda: not any(alive(p) for p in others), 10, "the other members gone")


def test_killed_supervisor_leaves_no_orphans(rig):
    w = rig["start"]()
    group = child_pids(w.p.pid)
    os.kill(w.p.pid, signal.SIGKILL)  # only the supervisor: the kernel takes its members down with it
    wait_until(lambda: not any(alive(p) for p in group), 10, f"members {group} gone")
