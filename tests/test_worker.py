"""The Celery path for real: the tests' Redis (conftest.py; a key prefix and queues of our own)
and one `arrcoc worker` process shared by the tests of this module."""

from __future__ import annotations

import concurrent.futures as cf
import json
import subprocess
import sys
import time
import zipfile

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
from arrcoc.errors import ImageError, InvalidInputError, JobError
from arrcoc.request import Controls
from arrcoc.service.client.queue import TASKS
from arrcoc.service.jobs.types import BenchRequest, JobState
from arrcoc.settings import default_settings


def test_registered_tasks_and_config_exactly():
    from worker.app import app

    app.loader.import_default_modules()  # what the worker does at start: imports worker.tasks
    assert {n for n in app.tasks if not n.startswith("celery.")} == set(TASKS)
    c = app.conf
    assert (c.task_serializer, c.result_serializer, c.accept_content) == ("json", "json", ["json"])
    assert c.task_acks_late and c.task_reject_on_worker_lost
    # per-message extras off (Redis writes and event publishes nothing reads; Flower enables events itself)
    assert not c.task_track_started and not c.worker_send_task_events and not c.task_send_sent_event
    assert c.worker_prefetch_multiplier == 1 and c.result_expires and c.task_time_limit


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("svc")
    with worker_settings(
        root, "arrcoc-test", engine={"buckets": "[1,2,4,8]"}, batching={"max_delay_ms": "20", "max_size": "8"}
    ) as settings:
        yield root, settings


@pytest.fixture(scope="module")
def worker(env):
    root, settings = env
    w = Worker(worker_env(BROKER, root / "data", **settings), root / "worker.log")
    try:
        yield w.ready(300)
    finally:
        w.stop()


def make_settings(env, **overrides):
    """The worker's settings (validated from the same strings its environment gives it), for an
    executor; `overrides` by group."""
    root, s = env
    service = {"service": {"broker_url": BROKER, "data_dir": root / "data", "redis_timeout_s": 3.0}}
    return default_settings(**merged(s, service, overrides))


@pytest.fixture(scope="module")
def celery_ex(env, worker):
    from arrcoc.service.client.celery_executor import CeleryExecutor

    ex = CeleryExecutor(make_settings(env))
    yield ex
    ex.close()


def wait_finished(ex, job_id, timeout=180.0, seen=None):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = ex.status(job_id)
        if seen is not None:
            seen.append((st.done, st.failed))
        if st.state.finished:
            return st
        time.sleep(0.05)  # a job's steps can be short: poll often enough to see progress between them
    raise AssertionError(f"{job_id} did not finish in {timeout} s: {st}")


def test_infer_round_trip_equals_inprocess(env, celery_ex):
    from arrcoc.service.client.inprocess import InProcessExecutor

    local = InProcessExecutor(make_settings(env, service={"broker_url": None}))
    try:
        image = (REPO / "arrcoc" / "examples" / "coffee.jpg").read_bytes()
        for controls in (None, Controls(k=16, token_budget=2048, scale_perspectival=0.5)):
            assert_same_result(
                celery_ex.infer(image, "the red mug", controls), local.infer(image, "the red mug", controls)
            )
    finally:
        local.close()
    with pytest.raises(ImageError):  # refused on the submitting side: nothing queued
        celery_ex.infer(b"GIF89a broken", "q")
    # the header is fine, the body cut short: the submitting side reads headers only, the worker decodes
    with pytest.raises(ImageError, match="corrupt or truncated"):
        celery_ex.infer(image[: len(image) // 2], "q")
    with pytest.raises(InvalidInputError, match="K must be"):  # refused by the worker, told to the caller
        celery_ex.infer(png_bytes(0), "q", Controls(k=0))


def test_answers_come_on_reply_lists_that_leave_nothing_behind_and_older_messages_still_get_theirs(
    env, celery_ex
):
    """A request's answer comes back on its own reply list (no Celery result stored, nothing left
    in Redis); a message queued by an older client, which names no reply list, is still answered
    through Celery's result backend, with the same result."""
    from arrcoc.request import image_key
    from arrcoc.service.client.queue import PRIORITY_INFER, TASK_INFER
    from arrcoc.service.codec import result_from_wire

    s = celery_ex.settings
    image = png_bytes(5)
    new = celery_ex.infer(image, "the sky")
    r = celery_ex.raw
    assert not [
        k
        for pat in (
            f"{s.service.redis_prefix}:reply:*",
            f"{s.service.redis_prefix}:attempts:*",
            "celery-task-meta-*",
        )
        for k in r.scan_iter(pat)
    ]
    key = image_key(s, image)
    r.set(key, image, ex=60)
    old = celery_ex.app.send_task(
        TASK_INFER,
        args=[key, "the sky", None, time.time() + 60],
        queue=s.service.queue_gpu,
        priority=PRIORITY_INFER,
    )
    doc = old.get(timeout=60)
    old.forget()
    assert_same_result(result_from_wire(doc["result"]), new)


def test_a_reply_frame_is_bit_identical_and_a_bad_one_is_a_clear_error(celery_ex):
    from arrcoc.errors import EngineError
    from arrcoc.service.codec import error_to_frame, result_from_frame, result_to_frame

    result = celery_ex.infer(png_bytes(6), "the sky")
    frame = result_to_frame(result)
    back = result_from_frame(frame)
    assert_same_result(back, result, exact=True)  # the frame carries the float32 bytes as they are
    assert back.texture.tobytes() == result.texture.tobytes() and back.timings_ms == result.timings_ms
    with pytest.raises(ImageError, match="unreadable"):  # an error frame raises the error it carries
        result_from_frame(error_to_frame(ImageError("unreadable image")))
    for bad in (
        frame[:-3],
        frame + b"x",
        b"",
        b"X" + frame[1:],
        frame.replace(b'"<f4"', b'"|O8"', 1),
        b"R\xff\xff",
    ):
        with pytest.raises(EngineError, match="could not be read"):
            result_from_frame(bad)


def test_a_worker_bug_reaches_the_caller_at_once_and_no_reply_list_outside_the_service_is_written(env):
    """The task's own failure, not an ArrcocError, is answered on the reply list (the caller does not
    wait out its timeout); a message naming another key as its reply list writes nothing. The engine
    host here is a stand-in that fails: a real one cannot be made to fail on demand."""
    from arrcoc.errors import ArrcocError, EngineError
    from arrcoc.service.codec import result_from_frame
    from worker.state import WorkerState

    class FailingHost:
        def infer(self, *args, **kwargs):
            raise RuntimeError("boom")

        def close(self):
            pass

    s = make_settings(env)
    state = WorkerState()
    state.configure(s)
    state._host = FailingHost()
    r = state.raw
    r.set(f"{s.service.redis_prefix}:img:x", b"bytes", ex=60)
    reply = f"{s.service.redis_prefix}:reply:t1"
    assert (
        state.infer("t1", f"{s.service.redis_prefix}:img:x", "q", None, time.time() + 30, None, reply) is None
    )
    assert 0 < r.ttl(reply) <= s.service.image_ttl_s
    with pytest.raises(EngineError, match="The worker failed: RuntimeError: boom"):
        result_from_frame(r.lpop(reply))
    with pytest.raises(ArrcocError, match="not a key of this service"):
        state.infer("t2", f"{s.service.redis_prefix}:img:x", "q", None, time.time() + 30, None, "elsewhere")
    assert not r.exists("elsewhere") and not r.exists(f"{s.service.redis_prefix}:attempts:t2")
    state.close()


def test_dynamic_batching_forms_buckets_under_concurrency(celery_ex):
    image = png_bytes(3)
    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(lambda i: celery_ex.infer(image, "the sky", timeout=120), range(24)))
    buckets = [r.bucket for r in results]
    assert max(buckets) > 1, buckets


def test_batch_job_with_progress_and_zip(celery_ex):
    n = 120  # several pipeline steps (16 items a step at these buckets), so progress is seen between them
    files = {f"photos/p{i:03d}.png": png_bytes(100 + i) for i in range(n)}
    files["photos/corrupt.png"] = b"\x89PNG\r\n\x1a\n truncated"
    manifest = "file,query\n" + "".join(
        f"{name},{'the sky' if i % 2 else 'a face'}\n" for i, name in enumerate(files)
    )
    files["manifest.csv"] = manifest.encode()
    job = celery_ex.submit_batch(make_zip(files), overlays="relevance")
    seen: list[tuple[int, int]] = []
    st = wait_finished(celery_ex, job, seen=seen)
    assert (st.state, st.total, st.done, st.failed) == (JobState.DONE, n + 1, n, 1), st
    assert seen == sorted(seen) and any(0 < d + f < n + 1 for d, f in seen)  # progress, never backwards
    with zipfile.ZipFile(celery_ex.batch_results(job)) as zf:
        rows = result_rows(zf)
        assert [r["index"] for r in rows] == list(range(n + 1))
        assert [r["query"] for r in rows[:2]] == ["a face", "the sky"]
        bad = [r for r in rows if not r["ok"]]
        assert len(bad) == 1 and bad[0]["file"] == "photos/corrupt.png" and bad[0]["error"]
        assert len([m for m in zf.namelist() if m.startswith("overlays/") and m.endswith(".jpg")]) == n
        assert len(zf.read("summary.csv").decode().splitlines()) == n + 2


def test_a_job_of_several_chunks_gets_the_results_zip_its_first_chunk_wrote_as_the_others_ran(env, worker):
    """Through Celery a job runs as chunks side by side. The first chunk's worker goes on writing
    results.zip while the others run, appending their parts as they are recorded, so results.zip is
    not built again at the end: it is a second name for the file that chunk wrote, and equals the
    results.zip built from the parts (every member, every row once, in order)."""
    from arrcoc.service.client.celery_executor import CeleryExecutor
    from arrcoc.service.jobs.files import job_dir
    from arrcoc.service.jobs.parts import PART_SUFFIX, read_part
    from arrcoc.service.jobs.results_zip import build_results_zip

    settings = make_settings(env, batching={"chunk_items": 8})
    ex8 = CeleryExecutor(settings)
    try:
        n = 40
        files = {f"p{i:02d}.png": png_bytes(300 + i) for i in range(n)} | {"p13x.png": b"\x89PNG not really"}
        job = ex8.submit_batch(make_zip(files), "the red mug", overlays="relevance")
        st = wait_finished(ex8, job)
        assert (st.state, st.done, st.failed) == (JobState.DONE, n, 1), st
        jd = job_dir(settings, job)
        written = {read_part(p).pictures.file for p in (jd / "results").glob(f"*{PART_SUFFIX}")}
        streamed = [f for f in written if f.endswith(".results.zip")]
        assert len(streamed) == 1 and (jd / streamed[0]).samefile(jd / "results.zip")

        def content(path):
            with zipfile.ZipFile(path) as zf:
                assert zf.testzip() is None  # every member's CRC checks out
                return {m: zf.read(m) for m in zf.namelist() if m != "results.parquet"}, result_rows(zf)

        followed = content(jd / "results.zip")
        assert [r["index"] for r in followed[1]] == list(range(n + 1))
        assert len([m for m in followed[0] if m.startswith("overlays/")]) == n
        (jd / "results.zip").rename(jd / "followed.zip")
        rebuilt = content(build_results_zip(jd))
        assert rebuilt[0] == followed[0] and rebuilt[1] == followed[1]
    finally:
        ex8.close()


def test_a_job_cancelled_while_its_first_chunk_follows_lets_go_and_keeps_what_ran(env, worker):
    """Cancelled after its first chunk: the worker writing its results.zip stops following (the
    job's finish lock is free again, no thread waits on), the results fetched hold every recorded
    item once, and the worker serves the next job."""
    import fcntl

    from arrcoc.service.client.celery_executor import CeleryExecutor
    from arrcoc.service.jobs.files import job_dir
    from arrcoc.service.jobs.finishing import FINISH_LOCK

    settings = make_settings(env, batching={"chunk_items": 8})
    ex8 = CeleryExecutor(settings)
    try:
        n = 160
        job = ex8.submit_batch(make_zip({f"p{i:03d}.png": png_bytes(500 + i) for i in range(n)}), "the sky")
        st = ex8.status(job)
        t0 = time.monotonic()
        while st.done < 12 and not st.state.finished and time.monotonic() - t0 < 180:  # past the first chunk
            time.sleep(0.02)
            st = ex8.status(job)
        assert not st.state.finished, "the job finished before the cancel; make it longer"
        assert ex8.cancel(job).state == JobState.CANCELLED
        lock = job_dir(settings, job) / "results" / FINISH_LOCK

        def free() -> bool:
            with open(lock, "a") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
                return True

        t0 = time.monotonic()
        while not free():
            assert time.monotonic() - t0 < 60, "the first chunk's worker still follows a cancelled job"
            time.sleep(0.1)
        st = wait_finished(ex8, job)
        assert st.state == JobState.CANCELLED and st.done < n
        with zipfile.ZipFile(ex8.batch_results(job)) as zf:  # what was recorded when it was built
            rows = result_rows(zf)
        indices = [r["index"] for r in rows]
        assert indices == sorted(set(indices)) and len(indices) >= st.done + st.failed >= 12
        after = ex8.submit_batch(make_zip({f"{i}.png": png_bytes(700 + i) for i in range(8)}), "the sky")
        assert wait_finished(ex8, after).state == JobState.DONE
    finally:
        ex8.close()


def test_cancel_and_unknown(celery_ex):
    job = celery_ex.submit_batch(make_zip({f"{i}.png": png_bytes(i) for i in range(40)}), "q")
    st = celery_ex.cancel(job)
    assert st.state == JobState.CANCELLED
    time.sleep(2)
    st = celery_ex.status(job)
    assert st.state == JobState.CANCELLED and st.done < 40
    with pytest.raises(JobError, match="No job"):
        celery_ex.status("batch-0123456789abcdef")
    with pytest.raises(JobError, match="not a job id"):
        celery_ex.status("../../etc")


def test_expired_job_reports_expired_not_pending(env, worker):
    from arrcoc.service.client.celery_executor import CeleryExecutor

    ex = CeleryExecutor(make_settings(env, jobs={"ttl_s": 2}))
    try:
        job = ex.submit_batch(make_zip({"a.png": png_bytes(1)}), "q")
        wait_finished(ex, job, timeout=120)
        wait_for(lambda: ex.status(job).state == JobState.EXPIRED, 60, "the job expired")
        with pytest.raises(JobError, match="expired"):
            ex.batch_results(job)
    finally:
        ex.close()


def test_bench_job_holds_the_device(celery_ex):
    job = celery_ex.submit_bench(
        BenchRequest(
            variants=("arrcoc-texture",),
            backends=("eager",),
            buckets=(1,),
            iterations=2,
            warmup=1,
            device="cpu",
        )
    )
    st = wait_finished(celery_ex, job, timeout=120)
    assert st.state == JobState.DONE, st.message
    report = celery_ex.bench_report(job)
    assert report["results"] and report["device_exclusive"]["held_ms"] > 0


def test_cli_submit_infer_and_batch(env, worker, tmp_path):
    root, settings = env
    run_env = worker_env(BROKER, root / "data", **settings)
    image = REPO / "arrcoc" / "examples" / "chelsea.jpg"
    out = tmp_path / "r.json"
    cli = [sys.executable, "-m", "arrcoc", "submit"]
    subprocess.run(
        [*cli, "infer", str(image), "--query", "a cat's face", "--json", str(out)],
        env=run_env,
        check=True,
        timeout=120,
        cwd=REPO,
    )
    doc = json.loads(out.read_text())
    from arrcoc.result import JSON_KEYS

    assert set(JSON_KEYS) <= set(doc) and doc["query"] == "a cat's face"
    archive = tmp_path / "in.zip"
    archive.write_bytes(make_zip({f"{i}.png": png_bytes(i) for i in range(3)}))
    proc = subprocess.run(
        [*cli, "batch", str(archive), "--query", "sky", "--out", str(tmp_path / "out.zip")],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[0]
    assert job_id.startswith("batch-") and "3 done" in proc.stderr
    assert "results.parquet" in zipfile.ZipFile(tmp_path / "out.zip").namelist()
    status = subprocess.run(
        [sys.executable, "-m", "arrcoc", "job", "status", job_id, "--json"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert json.loads(status.stdout)["state"] == "done"
    for fmt in ("parquet", "jsonl"):  # the rows alone, as Parquet or converted to JSON lines
        subprocess.run(
            [
                sys.executable,
                "-m",
                "arrcoc",
                "job",
                "fetch",
                job_id,
                "--format",
                fmt,
                "--out",
                str(tmp_path / f"rows.{fmt}"),
            ],
            env=run_env,
            check=True,
            timeout=60,
            cwd=REPO,
        )
    lines = [json.loads(x) for x in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [x["index"] for x in lines] == [0, 1, 2] and len(lines[0]["relevance"]) == 32
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "rows.parquet")["file"].to_pylist() == [x["file"] for x in lines]


def test_cli_loadtest_spreads_clients_over_processes(env, worker, tmp_path):
    """The load generator used for the batching figures: every request answered, from 2 processes."""
    root, settings = env
    out = tmp_path / "load.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "arrcoc",
            "submit",
            "loadtest",
            "--clients",
            "6",
            "--requests",
            "12",
            "--processes",
            "2",
            "--json",
            str(out),
            "--timeout",
            "120",
        ],
        env=worker_env(BROKER, root / "data", **settings),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert (report["ok"], report["client_processes"], report["errors"]) == (12, 2, [])
    assert sum(report["buckets"].values()) == 12 and report["throughput_rps"] > 0
    assert 0 < report["client_cpu_ms_per_request"] and report["p50_ms"] <= report["p99_ms"]
    assert report["timings_ms_mean"]["task_cpu_ms"] > 0 and report["timings_ms_mean"]["batch_cpu_ms"] > 0


def test_prefork_worker_builds_the_engine_in_the_child_only(env, tmp_path):
    from arrcoc.service.client.celery_executor import CeleryExecutor

    root, settings = env
    service = settings["service"]
    queues = {
        "service": {"queue_gpu": service["queue_gpu"] + "-pf", "queue_bench": service["queue_bench"] + "-pf"}
    }
    w = Worker(
        worker_env(BROKER, root / "data", **merged(settings, queues)),
        tmp_path / "prefork.log",
        pool="prefork",
    )
    ex = None
    try:
        w.ready(300)
        log = w.text()
        assert "ForkPoolWorker-1] engine" in log and "MainProcess] engine" not in log  # CUDA-safe parent
        ex = CeleryExecutor(make_settings(env, **queues))
        assert ex.infer(png_bytes(5), "the sky").query == "the sky"
    finally:
        if ex is not None:
            ex.close()
        w.stop()
