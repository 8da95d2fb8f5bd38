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
from helpers import BROKER, make_zip, worker_settings
from PIL import Image

from arrcoc.bench.processes import Worker, worker_env
from arrcoc.errors import InvalidInputError, JobError
from arrcoc.service.jobs.types import BenchRequest, JobState
from arrcoc.settings import default_settings

TOKEN = uuid.uuid4().hex


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("abuse-worker")
    with worker_settings(root, "arrcoc-abuse", buckets="[1,2]", batch_max_size="2", max_bench_iterations="100000",
                         api_token=TOKEN) as settings:  # fmt: skip
        yield root, settings


@pytest.fixture(scope="module")
def worker(env):
    root, settings = env
    w = Worker(worker_env(BROKER, root / "data", **settings), root / "worker.log")
    try:
        yield w.ready()
    finally:
        w.stop()


@pytest.fixture(scope="module")
def ex(env, worker):
    from arrcoc.service.client.celery_executor import CeleryExecutor

    root, s = env
    fields = {k: v for k, v in s.items() if k not in ("buckets", "batch_max_size", "max_bench_iterations")}
    ex = CeleryExecutor(default_settings(**fields, buckets=(1, 2), broker_url=BROKER, data_dir=root / "data",
                                         max_bench_iterations=100000))  # fmt: skip
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
    good = {"good/a.png": png_bytes(64, seed=1), "good/b.png": png_bytes(64, seed=2),
            "modes/cmyk.jpg": encode(rgb.convert("CMYK"), "JPEG"), "modes/p.gif": encode(rgb.convert("P"), "GIF"),
            "modes/1bit.bmp": encode(rgb.convert("1"), "BMP"), "modes/la.png": encode(rgb.convert("LA"), "PNG"),
            "modes/i16.png": png16(256), "modes/rgba.webp": encode(rgb.convert("RGBA"), "WEBP")}  # fmt: skip
    bad = {"bad/truncated.png": png_bytes(64)[:300], "bad/text.png": b"hello, not an image",
           "bad/bomb.png": png_header(20000, 20000), "bad/tiny.png": png_bytes(8), "bad/empty.jpg": b""}  # fmt: skip
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
    st = wait(lambda: (s := ex.status(job, owner="client:" + "a" * 32)).state.finished and s, 180, "the job finished")
    assert st.state == JobState.DONE and st.total == len(names) == st.done + st.failed, st
    with zipfile.ZipFile(ex.batch_results(job)) as zf:
        rows = [json.loads(x) for x in zf.read("results.jsonl").splitlines()]
    assert [r["file"] for r in rows] == names  # every item, in order, once
    failed = {r["file"]: r["error"] for r in rows if not r["ok"]}
    assert set(failed) >= {n for n in names if n.startswith("bad/")} | {"good/b.png", "modes/la.png"}, failed
    assert all(isinstance(m, str) and 10 < len(m) < 400 and "Traceback" not in m for m in failed.values()), failed
    assert "control character" in failed["good/b.png"] and "limit" in failed["modes/la.png"]
    jd = ex.settings.data_dir / "jobs" / job
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
    job = ex.submit_bench(BenchRequest(backends=("eager",), buckets=(1,), iterations=100000, warmup=1, device="cpu"))
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
    monkeypatch.setenv("ARRCOC_BROKER_URL", BROKER)
    monkeypatch.setenv("ARRCOC_REDIS_PREFIX", s["redis_prefix"])
    monkeypatch.delenv("ARRCOC_API_TOKEN", raising=False)
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
    queues = {"queue_gpu": s["queue_gpu"] + "-grp", "queue_bench": s["queue_bench"] + "-grp"}
    w = Worker(worker_env(BROKER, root / "data", **(s | queues | {"worker_processes": "2"})), tmp_path / "group.log")
    ex = None
    try:
        w.ready(timeout=240)
        fields = {k: v for k, v in (s | queues).items() if k not in ("buckets", "batch_max_size", "max_bench_iterations")}
        ex = CeleryExecutor(default_settings(**fields, buckets=(1, 2), broker_url=BROKER, data_dir=root / "data",
                                             max_bench_iterations=100000))  # fmt: skip
        job = ex.submit_bench(BenchRequest(backends=("eager",), buckets=(1,), iterations=100000, warmup=1, device="cpu"))
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
