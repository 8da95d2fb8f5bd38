"""`arrcoc worker --devices` for real, with two CPU "devices" standing in for two GPUs (CI has none):
an engine process per device, a Celery process per device, one Redis. One batch job runs on both
engines, interactive requests go to both, and one engine's death loses nothing and stops nothing
else. Then the scale-out of docs/service.md: two worker groups, as on two hosts, each with its
own path to one shared data directory."""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import (
    BROKER,
    assert_same_result,
    make_zip,
    merged,
    png_bytes,
    result_rows,
    wait_for,
    worker_settings,
)

from arrcoc.bench.processes import REPO, Worker, worker_env
from arrcoc.service.jobs.types import JobState
from arrcoc.settings import default_settings

GROUP = {
    "engine": {"devices": "cpu,cpu", "worker_processes": "1", "processes": "1", "buckets": "[1,2,4]"},
    "batching": {"max_size": "4", "max_delay_ms": "20", "chunk_items": "6"},
}


# the rig's Celery processes (worker/group.py names them): only they are asked, whatever else
# answers broadcasts on the tests' Redis
NODES = [f"arrcoc-{i}@{socket.gethostname()}" for i in (1, 2)]


def engines(ex, up: bool = False, timeout: float = 120.0) -> dict[str, dict]:
    """The rig's two engine processes, by address, as its Celery processes see them (`up`: both
    answering). Asked again until both are there: on a busy machine a reply can come late."""

    def ask() -> dict[str, dict] | None:
        replies = ex.app.control.broadcast("arrcoc_engines", destination=NODES, reply=True, timeout=10.0)
        found = {e["address"]: e for reply in replies for node in reply.values() for e in node}
        return found if len(found) == 2 and (not up or all(e["up"] for e in found.values())) else None

    return wait_for(ask, timeout, "both engine processes reported", every=0.5)


def served(ex) -> dict[str, int]:
    return {address: e["served"]["items"] for address, e in engines(ex, up=True).items()}


def finished(ex, job: str, timeout: float = 240.0):
    return wait_for(lambda: (st := ex.status(job)).state.finished and st, timeout, f"job {job} finished")


def group(root: Path, settings: dict[str, dict[str, object]], data_dir: Path, name: str) -> Worker:
    env = worker_env(BROKER, data_dir, **settings)
    return Worker(env, root / f"{name}.log", name=f"{name}@%h").ready(300)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    root = tmp_path_factory.mktemp("devices")
    with worker_settings(root, "devices", **GROUP) as settings:
        worker = group(root, settings, root / "data", "arrcoc")  # the name compose gives (the healthcheck's)
        from arrcoc.service.client.celery_executor import CeleryExecutor

        # the executor's side: the group's queues and key prefix, its chunk size
        fields = {"service": settings["service"], "batching": {"chunk_items": 6}}
        ex = CeleryExecutor(
            default_settings(**merged(fields, {"service": {"broker_url": BROKER, "data_dir": root / "data"}}))
        )
        try:
            yield {"worker": worker, "ex": ex, "root": root, "settings": settings, "fields": fields}
        finally:
            ex.close()
            worker.stop()


def test_both_devices_serve_one_job_and_the_requests(rig):
    ex = rig["ex"]
    before = served(ex)
    assert len(before) == 2, engines(ex)  # one engine process per device, both answering
    files = {f"p{i:02d}.png": png_bytes(300 + i) for i in range(24)}
    job = ex.submit_batch(make_zip(files), "the sky")
    st = finished(ex, job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 24, 0), st
    with zipfile.ZipFile(ex.batch_results(job)) as zf:
        rows = result_rows(zf)
    assert sorted(r["index"] for r in rows) == list(range(24)) and all(r["ok"] for r in rows)
    after = served(ex)
    job_items = {a: after[a] - before.get(a, 0) for a in after}
    # several chunks, two Celery processes taking one each at a time: both devices ran some
    assert sum(job_items.values()) == 24 and all(n > 0 for n in job_items.values()), job_items

    image = png_bytes(7)
    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: ex.infer(image, "the sky", timeout=120), range(24)))
    spread = {a: n - after[a] for a, n in served(ex).items()}
    assert all(n > 0 for n in spread.values()), spread
    for r in results[1:]:
        assert_same_result(r, results[0])  # the same answer whichever device served it


def test_the_healthcheck_asks_every_celery_process_and_every_engine(rig):
    env = worker_env(BROKER, rig["root"] / "data", engine={"worker_processes": "1", "devices": "cpu,cpu"})
    check = subprocess.run(
        [sys.executable, str(REPO / "docker" / "healthcheck.py"), "worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stderr
    three = subprocess.run(
        [sys.executable, str(REPO / "docker" / "healthcheck.py"), "worker"],
        env=env | {"ARRCOC_ENGINE__WORKER_PROCESSES": "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert three.returncode == 1 and "2 of 4 Celery processes answered" in three.stderr, three.stderr


def test_one_engine_killed_the_job_finishes_and_it_comes_back(rig):
    ex, worker = rig["ex"], rig["worker"]
    pids = {a: e["pid"] for a, e in engines(ex).items()}
    victim, survivor = sorted(pids)
    files = {f"k{i:02d}.png": png_bytes(500 + i, 64) for i in range(36)}
    job = ex.submit_batch(make_zip(files), "the sky")
    wait_for(lambda: ex.status(job).done > 0, 120, "the job under way")
    os.kill(pids[victim], signal.SIGKILL)
    # an interactive request meanwhile is answered (by the other engine)
    assert ex.infer(png_bytes(8), "the sky", timeout=60).relevance is not None
    st = finished(ex, job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 36, 0), st
    with zipfile.ZipFile(ex.batch_results(job)) as zf:
        rows = result_rows(zf)
    assert sorted(r["index"] for r in rows) == list(range(36))  # every item exactly once
    assert worker.alive()  # the group stayed up
    now = engines(ex, up=True)  # the killed one back
    assert now[survivor]["pid"] == pids[survivor]  # the other engine was never touched
    assert now[victim]["pid"] != pids[victim]  # the killed one was started again, alone


def test_two_groups_as_two_hosts_share_one_data_directory(rig, tmp_path):
    """docs/service.md, "Past one host": one Redis, and the job data directory on shared storage that
    each host mounts at a path of its own (here: three symbolic links to one folder)."""
    shared = tmp_path / "nfs"
    shared.mkdir()
    mounts = {}
    for host in ("host-a", "host-b", "web"):
        (tmp_path / host).mkdir()
        mounts[host] = tmp_path / host / "data"
        mounts[host].symlink_to(shared, target_is_directory=True)
    settings = merged(rig["settings"], {"engine": {"devices": "", "worker_processes": "2"}})
    a = group(tmp_path, settings, mounts["host-a"], "hosta")
    b = group(tmp_path, settings, mounts["host-b"], "hostb")
    rig["worker"].stop()  # only the two "hosts" take this job
    from arrcoc.service.client.celery_executor import CeleryExecutor

    ex = CeleryExecutor(
        default_settings(
            **merged(rig["fields"], {"service": {"broker_url": BROKER, "data_dir": mounts["web"]}})
        )
    )
    try:
        files = {f"s{i:02d}.png": png_bytes(700 + i) for i in range(24)}
        job = ex.submit_batch(make_zip(files), "the sky")
        st = finished(ex, job)
        assert (st.state, st.done, st.failed) == (JobState.DONE, 24, 0), st
        with zipfile.ZipFile(ex.batch_results(job)) as zf:
            assert sorted(r["index"] for r in result_rows(zf)) == list(range(24))
        nodes = [f"{h}-{i}@{socket.gethostname()}" for h in ("hosta", "hostb") for i in (1, 2)]

        def chunks() -> dict[str, int] | None:  # every process's count, asked until all four answer
            stats = ex.app.control.inspect(destination=nodes, timeout=10.0).stats() or {}
            counts = {node: s.get("total", {}).get("arrcoc.batch_chunk", 0) for node, s in stats.items()}
            return counts if len(counts) == len(nodes) else None

        ran = wait_for(chunks, 120, "every Celery process of both hosts reported", every=0.5)
        hosts = {node.split("-")[0] for node, n in ran.items() if n > 0}
        assert hosts == {"hosta", "hostb"}, ran  # both hosts ran chunks of it
    finally:
        ex.close()
        a.stop()
        b.stop()
