"""Abuse through a real Celery worker (`arrcoc worker`, the tests' Redis from conftest.py, a prefix and
queues of our own): hostile items fail alone and nothing is lost; a cancelled benchmark frees the
device at once; the API token reaches `arrcoc job` through Redis; owners are kept apart."""

from __future__ import annotations

import io
import json
import time
import uuid
import zipfile

import pytest
from abuse_inputs import du, png16, png_bytes, png_header
from helpers import BROKER, make_zip, merged, result_rows, worker_settings
from PIL import Image

from arrcoc.bench.processes import Worker, worker_env
from arrcoc.errors import InvalidInputError, JobError
from arrcoc.service.jobs.types import BenchRequest, JobState
from arrcoc.settings import default_settings

TOKEN = uuid.uuid4().hex


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("abuse-worker")
    with worker_settings(
        root,
        "arrcoc-abuse",
        engine={"buckets": "[1,2]"},
        batching={"max_size": "2"},
        jobs={"max_bench_iterations": "100000"},
        access={"api_token": TOKEN},
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


@pytest.fixture(scope="module")
def ex(env, worker):
    from arrcoc.service.client.celery_executor import CeleryExecutor

    root, s = env
    ex = CeleryExecutor(
        default_settings(**merged(s, {"service": {"broker_url": BROKER, "data_dir": root / "data"}}))
    )
    yield ex
    ex.close()


def wait(pred, timeout: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if value := pred():
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} within {timeout} s")


def odd_images() -> dict[str, bytes]:
    """Odd modes and formats, truncations, a pixel bomb's header: each must fail (or pass) alone."""

    def encode(img: Image.Image, fmt: str, **kw) -> bytes:
        buf = io.BytesIO()
        img.save(buf, fmt, **kw)
        return buf.getvalue()

    rgb = Image.open(io.BytesIO(png_bytes(64)))
    good = {
        "good/a.png": png_bytes(64, seed=1),
        "good/b.png": png_bytes(64, seed=2),
        "modes/cmyk.jpg": encode(rgb.convert("CMYK"), "JPEG"),
        "modes/p.gif": encode(rgb.convert("P"), "GIF"),
        "modes/1bit.bmp": encode(rgb.convert("1"), "BMP"),
        "modes/la.png": encode(rgb.convert("LA"), "PNG"),
        "modes/i16.png": png16(256),
        "modes/rgba.webp": encode(rgb.convert("RGBA"), "WEBP"),
    }
    bad = {
        "bad/truncated.png": png_bytes(64)[:300],
        "bad/text.png": b"hello, not an image",
        "bad/bomb.png": png_header(20000, 20000),
        "bad/tiny.png": png_bytes(8),
        "bad/empty.jpg": b"",
    }
    return good | bad


def test_hostile_items_fail_alone_and_nothing_is_lost(ex):
    files = odd_images()
    names = sorted(files)
    queries = {n: "the sky" for n in names}
    queries["good/b.png"] = "\x1b[31mred\x1b[0m"  # control characters: this item fails, in words
    queries["modes/la.png"] = "x" * 600  # over the limit: fails alone
    manifest = "file,query\n" + "".join(f"{n},{queries[n]}\n" for n in names)
    job = ex.submit_batch(make_zip(files | {"manifest.csv": manifest.encode()}), owner="client:" + "a" * 32)
    with pytest.raises(JobError, match="No job"):  # another owner: no such job
        ex.status(job, owner="client:" + "b" * 32)
    st = wait(
        lambda: (s := ex.status(job, owner="client:" + "a" * 32)).state.finished and s,
        180,
        "the job finished",
    )
    assert st.state == JobState.DONE and st.total == len(names) == st.done + st.failed, st
    with zipfile.ZipFile(ex.batch_results(job)) as zf:
        rows = result_rows(zf)
    assert [r["file"] for r in rows] == names  # every item, in order, once
    failed = {r["file"]: r["error"] for r in rows if not r["ok"]}
    assert set(failed) >= {n for n in names if n.startswith("bad/")} | {"good/b.png", "modes/la.png"}, failed
    assert all(isinstance(m, str) and 10 < len(m) < 400 and "Traceback" not in m for m in failed.values()), (
        failed
    )
    assert "control character" in failed["good/b.png"] and "limit" in failed["modes/la.png"]
    jd = ex.settings.service.data_dir / "jobs" / job
    assert du(jd) < 20 * 1024 * 1024  # inputs + results of 13 small items


def test_hostile_requests_are_refused_before_anything_is_queued(ex):
    with pytest.raises(InvalidInputError, match="control character"):
        ex.infer(png_bytes(64), "the\x00sky")
    with pytest.raises(InvalidInputError, match="zip bomb|expand"):
        from abuse_inputs import bomb_zip

        ex.submit_batch(bomb_zip(256), "the sky")
    with pytest.raises(InvalidInputError, match="Iterations"):
        ex.submit_bench(BenchRequest(backends=("eager",), buckets=(1,), iterations=10**7, device="cpu"))


def test_cancelled_benchmark_frees_the_worker_device_at_once(ex):
    job = ex.submit_bench(
        BenchRequest(backends=("eager",), buckets=(1,), iterations=100000, warmup=1, device="cpu")
    )
    wait(lambda: "timing" in ex.status(job).message, 180, "the benchmark started timing")
    t0 = time.monotonic()
    assert ex.cancel(job).state == JobState.CANCELLED
    result = ex.infer(png_bytes(64, seed=9), "the sky", timeout=60)  # waits for the device, if still held
    freed_s = time.monotonic() - t0
    assert result.query == "the sky" and freed_s < 10, freed_s
    time.sleep(1.5)
    st = ex.status(job)
    assert st.state == JobState.CANCELLED and st.message == "Cancelled by the user.", st


def test_cli_job_needs_the_token_the_worker_published(env, worker, capsys, monkeypatch):
    from arrcoc.cli import main
    from arrcoc.settings import get_settings

    root, s = env
    monkeypatch.setenv("ARRCOC_SERVICE__BROKER_URL", BROKER)
    monkeypatch.setenv("ARRCOC_SERVICE__REDIS_PREFIX", s["service"]["redis_prefix"])
    monkeypatch.delenv("ARRCOC_ACCESS__API_TOKEN", raising=False)
    get_settings.cache_clear()
    try:
        assert main(["job", "status", "batch-0123456789abcdef"]) == 2
        assert "requires its API token" in capsys.readouterr().err
        assert main(["job", "status", "batch-0123456789abcdef", "--token", TOKEN]) == 2
        assert "No job" in capsys.readouterr().err
    finally:
        get_settings.cache_clear()


def test_cancelled_benchmark_frees_a_worker_groups_engine_process(env, tmp_path):
    """`arrcoc worker --processes 2`: the benchmark runs in the engine process; the cancel reaches it
    through the Celery process's answer to its progress (go/stop)."""
    from arrcoc.service.client.celery_executor import CeleryExecutor

    root, s = env
    queues = {
        "service": {
            "queue_gpu": s["service"]["queue_gpu"] + "-grp",
            "queue_bench": s["service"]["queue_bench"] + "-grp",
        }
    }
    w = Worker(
        worker_env(BROKER, root / "data", **merged(s, queues, {"engine": {"worker_processes": "2"}})),
        tmp_path / "group.log",
    )
    ex = None
    try:
        w.ready(timeout=300)
        service = {"service": {"broker_url": BROKER, "data_dir": root / "data"}}
        ex = CeleryExecutor(default_settings(**merged(s, queues, service)))
        job = ex.submit_bench(
            BenchRequest(backends=("eager",), buckets=(1,), iterations=100000, warmup=1, device="cpu")
        )
        wait(lambda: "timing" in ex.status(job).message, 180, "the benchmark started timing")
        t0 = time.monotonic()
        ex.cancel(job)
        assert ex.infer(png_bytes(64, seed=3), "the sky", timeout=60).query == "the sky"
        assert time.monotonic() - t0 < 10
        time.sleep(1.5)
        assert ex.status(job).state == JobState.CANCELLED
    finally:
        if ex is not None:
            ex.close()
        w.stop()


# ---- second pass: a job always ends, a lost worker's chunk comes back within a minute --------------


def test_a_lone_surrogate_query_is_refused_before_anything_is_queued(ex):
    """Through Celery the job stayed "running 0/8" forever and `arrcoc submit batch` never returned."""
    rows = [{"file": f"{i}.png", "query": "\ud800" if i == 3 else "the sky"} for i in range(8)]
    manifest = "\n".join(json.dumps(r) for r in rows).encode()
    files = {f"{i}.png": png_bytes(48, seed=i) for i in range(8)} | {"manifest.jsonl": manifest}
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        ex.submit_batch(make_zip(files))


def test_a_chunk_that_raises_ends_its_job_with_counts(ex):
    """A chunk whose task raised left its job "running" forever (nothing recorded its items). Its
    items are recorded as failed with the reason, and the job ends."""
    from arrcoc.service.client.queue import PRIORITY_CHUNK, TASK_CHUNK
    from arrcoc.service.jobs import batch

    job, chunks, _ = batch.create_batch_job(
        make_zip({f"{i}.png": png_bytes(48, seed=i) for i in range(6)}),
        "the sky",
        None,
        ex.settings,
        ex.store,
    )
    (ex.settings.service.data_dir / "jobs" / job / "items.jsonl").unlink()  # the chunk cannot read its items
    for start, stop in chunks:
        ex._send(TASK_CHUNK, [job, start, stop], ex.settings.service.queue_gpu, PRIORITY_CHUNK)
    st = wait(lambda: (s := ex.status(job)).state.finished and s, 60, "the job ended")
    assert (st.state, st.done, st.failed) == (JobState.FAILED, 0, 6), st
    assert "the job's worker failed (FileNotFoundError" in st.message, st.message


def test_a_chunk_whose_worker_was_killed_resumes_within_a_minute(tmp_path):
    """After a SIGKILL the job sat at 104/300 "running" for an hour (the 3,600 s visibility timeout)
    with nothing in its status to explain it. A live worker renews what it holds, so the timeout
    is short (60 s by default; 8 s here): no chunk is delivered twice while its worker lives, a
    dead worker's chunk is taken up again within the timeout, and meanwhile the job says a worker
    was lost."""
    import signal

    from arrcoc.service.client.celery_executor import CeleryExecutor
    from arrcoc.settings import JobSettings

    assert JobSettings().visibility_timeout_s <= 60
    with worker_settings(
        tmp_path,
        "arrcoc-lost",
        engine={"buckets": "[1,2]"},
        batching={"max_size": "2"},
        jobs={"visibility_timeout_s": "8"},
    ) as s:
        env = worker_env(BROKER, tmp_path / "data", **s)
        first = Worker(env, tmp_path / "w1.log").ready(300)
        second = None
        ex = CeleryExecutor(
            default_settings(**merged(s, {"service": {"broker_url": BROKER, "data_dir": tmp_path / "data"}}))
        )
        try:
            total = 480  # long enough that the kill lands mid-chunk on a fast CPU too
            job = ex.submit_batch(
                make_zip({f"{i:03d}.png": png_bytes(48, seed=i) for i in range(total)}), "the sky"
            )
            wait(lambda: ex.status(job).done >= 8, 180, "the job got going")
            time.sleep(12)  # the chunk runs past its 8 s visibility timeout: renewed, not delivered again
            attempts = ex.store.r.hgetall(ex.store.key(job, "attempts"))
            assert max(int(n) for n in attempts.values()) == 1, attempts
            first.kill(signal.SIGKILL)
            first.p.wait(10)
            t_kill = time.monotonic()
            at_kill = ex.status(job)
            assert at_kill.state == JobState.RUNNING and at_kill.done < total, at_kill
            second = Worker(env, tmp_path / "w2.log")  # starts while the chunk waits out its timeout
            lost = wait(
                lambda: "worker was lost" in (m := ex.status(job).message) and m, 30, "the status said so"
            )
            assert "resuming" in lost, lost
            second.ready(300)
            wait(lambda: ex.status(job).done > at_kill.done, 120, "the job resumed")
            resumed_s = time.monotonic() - t_kill
            assert resumed_s < 90, resumed_s
            st = wait(lambda: (x := ex.status(job)).state.finished and x, 180, "the job finished")
            assert (st.state, st.done, st.failed) == (JobState.DONE, total, 0), st
            assert "worker was lost" not in st.message
            with zipfile.ZipFile(ex.batch_results(job)) as zf:
                rows = result_rows(zf)
            assert sorted(r["index"] for r in rows) == list(range(total))  # every item once
        finally:
            ex.close()
            for w in (first, second):
                if w is not None:
                    w.stop()


def test_a_small_job_of_another_owner_overtakes_a_big_one_on_a_worker(env, worker):
    """A worker ran every chunk of a big job it had taken before the first chunk of a small job that
    came after it. Owner A's 10 chunks, then owner B's one: B is done while A has most left."""
    from arrcoc.service.client.celery_executor import CeleryExecutor

    root, s = env
    service = {"service": {"broker_url": BROKER, "data_dir": root / "data"}}
    ex8 = CeleryExecutor(default_settings(**merged(s, service, {"batching": {"chunk_items": 8}})))
    a_owner, b_owner = "client:" + "a" * 32, "client:" + "b" * 32
    try:
        manifest = "file,query\n" + "a.png,the sky\n" * 80
        a = ex8.submit_batch(
            make_zip({"a.png": png_bytes(48), "manifest.csv": manifest.encode()}), owner=a_owner
        )
        wait(lambda: ex8.status(a, a_owner).done >= 1, 120, "A started")
        b = ex8.submit_batch(
            make_zip({f"{i}.png": png_bytes(48, seed=i) for i in range(8)}), "the sky", owner=b_owner
        )
        sb = wait(lambda: (x := ex8.status(b, b_owner)).state.finished and x, 180, "B finished")
        sa = ex8.status(a, a_owner)
        assert sb.state == JobState.DONE and sb.done == 8, sb
        assert sa.done <= 40, f"B finished when A had done {sa.done} of 80"
        sa = wait(lambda: (x := ex8.status(a, a_owner)).state.finished and x, 300, "A finished")
        assert (sa.state, sa.done) == (JobState.DONE, 80), sa
    finally:
        ex8.close()
