"""The service's pieces without workers: zip checks, the dynamic batcher, the job store contract
(memory and real Redis), and the in-process executor's batch and benchmark jobs."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import threading
import time
import uuid
import zipfile

import numpy as np
import pytest
from helpers import BROKER, make_zip, png_bytes, seeded_weights

from arrcoc.errors import DeadlineExceeded, ImageError, InvalidInputError, JobError
from arrcoc.request import Controls
from arrcoc.service.host.batching import DynamicBatcher
from arrcoc.service.jobs.archive import load_items, unpack
from arrcoc.service.jobs.store import MemoryJobStore, RedisJobStore, redis_client
from arrcoc.service.jobs.types import BenchRequest, JobKind, JobState
from arrcoc.settings import default_settings


@pytest.fixture
def settings(tmp_path):
    return default_settings(data_dir=tmp_path / "data", buckets=(1, 2, 4), max_batch_items=100,
                            weights=str(seeded_weights(tmp_path / "w.safetensors")))  # fmt: skip


# -- zip input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "archive, query, message",
    [
        (b"", "q", "empty"),
        (b"PK\x03\x04 definitely not a zip", "q", "not a readable .zip"),
        (make_zip({}), "q", "no images"),
        (make_zip({"notes.txt": b"hello"}), "q", "no images"),
        (make_zip({"../evil.png": png_bytes(0)}), "q", "unsafe path"),
        (make_zip({"/etc/evil.png": png_bytes(0)}), "q", "unsafe path"),
        (make_zip({"a.png": png_bytes(0)}), None, "Give a query"),
        (make_zip({"a.png": png_bytes(0), "manifest.csv": b"file,query\na.png,x\nb.png,y\n"}), None, "lacks: b.png"),
        (make_zip({"a.png": png_bytes(0), "manifest.csv": b"name,q\na.png,x\n"}), None, "file,query"),
        (make_zip({"a.png": png_bytes(0), "manifest.jsonl": b'{"file": "a.png"}\n'}), None, "no query"),
        (make_zip({"a.png": png_bytes(0), "manifest.jsonl": b"{oops\n"}), None, "not JSON"),
        (make_zip({"bomb.png": b"\0" * (64 * 1024 * 1024)}), "q", "zip bomb"),
    ],
)
def test_bad_archives_are_refused_clearly(settings, tmp_path, archive, query, message):
    with pytest.raises(InvalidInputError, match=message):
        unpack(archive, query, tmp_path / "job", settings)


def test_zip_with_one_query_and_with_manifests(settings, tmp_path):
    items = unpack(make_zip({"b.png": png_bytes(1), "a.jpg": png_bytes(0), "x/readme.txt": b"",
                             "__MACOSX/._a.jpg": b""}), "the mug", tmp_path / "j1", settings)  # fmt: skip
    assert [(i.file, i.query) for i in items] == [("a.jpg", "the mug"), ("b.png", "the mug")]
    assert [i.file for i in load_items(tmp_path / "j1")] == ["a.jpg", "b.png"]
    csv = b"file,query\nb.png,a cat\na.jpg,\n"
    items = unpack(make_zip({"a.jpg": png_bytes(0), "b.png": png_bytes(1), "manifest.csv": csv}), "default",
                   tmp_path / "j2", settings)  # fmt: skip
    assert [(i.file, i.query) for i in items] == [("b.png", "a cat"), ("a.jpg", "default")]
    jsonl = b'{"file": "d/a.jpg", "query": "sky"}\n\n{"file": "d/a.jpg", "query": "sea"}\n'
    items = unpack(make_zip({"d/a.jpg": png_bytes(0), "manifest.jsonl": jsonl}), None, tmp_path / "j3", settings)
    assert [i.query for i in items] == ["sky", "sea"]
    with pytest.raises(InvalidInputError, match="limit is 100"):
        unpack(make_zip({f"{i}.png": b"x" for i in range(101)}), "q", tmp_path / "j4", settings)


# -- the dynamic batcher ---------------------------------------------------------------------
def test_batcher_coalesces_concurrent_requests_and_keeps_order():
    seen: list[int] = []

    def run(items):
        seen.append(len(items))
        time.sleep(0.02)
        return [ValueError(f"bad {x}") if x == 13 else x * 10 for x in items]

    b = DynamicBatcher(run, max_batch=8, max_delay_s=0.05)
    futures = [b.submit(i) for i in range(40)]
    assert [f.result(5) for i, f in enumerate(futures) if i != 13] == [i * 10 for i in range(40) if i != 13]
    with pytest.raises(ValueError, match="bad 13"):
        futures[13].result()
    assert max(seen) == 8 and sum(seen) == 40 and len(seen) <= 6
    # a lone request waits at most the delay
    t0 = time.perf_counter()
    assert b.submit(1).result(5) == 10
    assert time.perf_counter() - t0 < 0.5
    # past its deadline: never run, told why
    with pytest.raises(DeadlineExceeded):
        b.submit(2, deadline=time.monotonic() - 1).result(5)
    b.close()


def test_a_lone_request_runs_at_once_unless_told_to_wait_when_idle():
    """At low load the batching delay only adds latency: a request with nobody else waiting (after
    a batch of one) runs at once; `idle_wait` restores Triton's rule (always wait the delay)."""
    for idle_wait, at_least, at_most in ((False, 0.0, 0.5), (True, 1.0, 5.0)):
        b = DynamicBatcher(lambda items: items, max_batch=8, max_delay_s=1.0, idle_wait=idle_wait)
        for i in range(2):  # the first, and one after a batch of one
            t0 = time.perf_counter()
            assert b.submit(i).result(10) == i
            assert at_least <= time.perf_counter() - t0 < at_most, (idle_wait, i)
        b.close()


def test_batcher_off_runs_one_at_a_time():
    sizes = []
    b = DynamicBatcher(lambda items: sizes.append(len(items)) or items, max_batch=1, max_delay_s=0.01)
    threads = [threading.Thread(target=lambda i=i: b.submit(i).result(5)) for i in range(10)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sizes == [1] * 10
    b.close()


def test_pipelined_batcher_gathers_the_next_batch_while_the_device_runs_one():
    """With prepare_batch (a GPU decodes a batch's JPEGs) one thread starts batch k on the device,
    gathers batch k+1 from what arrived meanwhile, hands batch k out, then prepares batch k+1; an item
    that fails to prepare fails alone; every other caller gets its own result."""
    log, threads, futures = [], set(), []

    def prepare(items):
        log.append(("prepare", list(items)))
        threads.add(threading.current_thread().name)
        return [ValueError(f"undecodable {x}") if x == 7 else x for x in items]

    def launch(items):
        log.append(("launch", list(items)))
        threads.add(threading.current_thread().name)
        if items == [0, 1, 2, 3]:  # while batch k is on the device, the next requests arrive
            futures.extend(b.submit(i) for i in range(4, 12))

        def wait():
            log.append(("wait", list(items)))
            return [x * 10 for x in items]

        return wait

    # idle_wait: the first four gather into one batch (with the device idle they would go at once)
    b = DynamicBatcher(lambda items: pytest.fail("runs through launch_batch"), max_batch=8, max_delay_s=0.05,
                       prepare_batch=prepare, idle_wait=True, launch_batch=launch, name="pipelined")  # fmt: skip
    futures.extend(b.submit(i) for i in range(4))
    assert [f.result(5) for f in futures[:4]] == [0, 10, 20, 30]
    deadline = time.monotonic() + 5
    while len(futures) < 12 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert [f.result(5) for i, f in enumerate(futures) if i != 7] == [i * 10 for i in range(12) if i != 7]
    with pytest.raises(ValueError, match="undecodable 7"):
        futures[7].result(5)
    assert log == [("prepare", [0, 1, 2, 3]), ("launch", [0, 1, 2, 3]), ("wait", [0, 1, 2, 3]),
                   ("prepare", list(range(4, 12))), ("launch", [4, 5, 6, 8, 9, 10, 11]),
                   ("wait", [4, 5, 6, 8, 9, 10, 11])], log  # fmt: skip
    assert threads == {"pipelined"}
    # a lone request with the device idle: prepared, started and handed out at once
    lone = DynamicBatcher(lambda items: [threading.current_thread().name for _ in items], prepare_batch=prepare,
                          name="lone")  # fmt: skip
    t0 = time.perf_counter()
    assert lone.submit(1).result(5) == "lone"
    assert time.perf_counter() - t0 < 0.5
    with pytest.raises(ValueError, match="undecodable 7"):
        lone.submit(7).result(5)
    lone.close()
    b.close()


def test_pipelined_batcher_gathers_while_the_device_is_busy_and_goes_when_it_is_idle():
    """The delay buys a larger batch only while the device is busy; with the device idle, waiting
    it out only adds latency: what has queued goes at once."""
    release, sizes = threading.Event(), []

    def run(items):
        sizes.append(len(items))
        if len(sizes) == 1:
            assert release.wait(5)
        return items

    b = DynamicBatcher(run, max_batch=8, max_delay_s=2.0, prepare_batch=lambda items: items)
    t0 = time.perf_counter()
    futures = [b.submit(i) for i in range(3)]  # the engine is idle: they go without the 2 s delay
    deadline = time.monotonic() + 5
    while not sizes and time.monotonic() < deadline:
        time.sleep(0.005)
    futures += [b.submit(i) for i in range(3, 8)]  # the engine busy: these gather into one batch
    time.sleep(0.1)
    release.set()
    assert [f.result(5) for f in futures] == list(range(8))
    assert time.perf_counter() - t0 < 1.5, "a batch waited out the delay while the engine was idle"
    assert sizes[0] <= 3 and sizes[1:] == [8 - sizes[0]], sizes
    b.close()


# -- the job store: one contract, two implementations -----------------------------------------
@pytest.fixture(params=["memory", "redis"])
def store(request):
    if request.param == "memory":
        yield MemoryJobStore()
        return
    client = redis_client(BROKER, 2.0)
    prefix = f"arrcoc-test-{uuid.uuid4().hex[:8]}"
    yield RedisJobStore(client, prefix)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_store_contract(store):
    store.create("batch-0000000000000001", JobKind.BATCH, 3, 60, {"controls": {"k": 5}})
    st = store.status("batch-0000000000000001")
    assert (st.state, st.total, st.done, st.failed) == (JobState.PENDING, 3, 0, 0)
    assert json.loads(store.record("batch-0000000000000001")["controls"]) == {"k": 5}
    assert store.set_state("batch-0000000000000001", JobState.RUNNING, expect=(JobState.PENDING,))
    assert not store.set_state("batch-0000000000000001", JobState.RUNNING, expect=(JobState.PENDING,))
    assert store.mark_item("batch-0000000000000001", 0)
    assert not store.mark_item("batch-0000000000000001", 0)  # a redelivery counts nothing twice
    assert not store.mark_item("batch-0000000000000001", 0, "late error")
    assert store.mark_item("batch-0000000000000001", 1, "broken image")
    assert store.item_finished("batch-0000000000000001", 1) and not store.item_finished("batch-0000000000000001", 2)
    assert store.counts("batch-0000000000000001") == (1, 1)
    assert store.failed_items("batch-0000000000000001") == {1: "broken image"}
    assert [store.attempt("batch-0000000000000001", 2) for _ in range(3)] == [1, 2, 3]
    assert store.set_state("batch-0000000000000001", JobState.DONE, "note")
    assert store.status("batch-0000000000000001").message == "note"
    with pytest.raises(JobError, match="No job"):
        store.status("batch-00000000000000ff")


def test_store_reports_queue_position_of_pending_jobs(store):
    ids = [f"batch-00000000000001{i:02d}" for i in range(3)]
    for job_id in ids:
        store.create(job_id, JobKind.BATCH, 1, 60, {})
        time.sleep(0.01)
    store.create("bench-0000000000000100", JobKind.BENCH, 1, 60, {})  # another queue
    assert [store.status(j).queue_position for j in ids] == [0, 1, 2]
    store.set_state(ids[0], JobState.RUNNING)
    assert [store.status(j).queue_position for j in ids] == [None, 1, 2]  # a running job is no longer queued
    store.set_state(ids[0], JobState.DONE)
    store.set_state(ids[1], JobState.CANCELLED)
    assert store.status(ids[2]).queue_position == 0
    assert store.status("bench-0000000000000100").queue_position == 0


def test_store_reports_expired_not_pending(store):
    store.create("batch-0000000000000002", JobKind.BATCH, 1, 1, {})
    assert store.status("batch-0000000000000002").state == JobState.PENDING
    time.sleep(2.1)
    st = store.status("batch-0000000000000002")
    assert st.state == JobState.EXPIRED and "expired" in st.message


# -- the in-process executor ----------------------------------------------------------------------
def test_a_runtime_leaves_a_lent_pipeline_open(settings):
    """A pipeline lent to a second runtime (benchmarks share one warm engine) still serves after
    that runtime closes: its owner closes it."""
    from arrcoc.service.host.runtime import Runtime

    owner = Runtime(settings)
    try:
        borrower = Runtime(settings, owner.pipeline)
        assert borrower.infer(png_bytes(1), "the sky", Controls(), 60).grid > 0
        borrower.close()
        assert owner.infer(png_bytes(2), "the sky", Controls(), 60).grid > 0
        assert owner.process([png_bytes(3)], ["the sky"], Controls(), "jpeg").items[0].result is not None
    finally:
        owner.close()


def test_the_device_is_held_from_launch_to_collect_and_never_left_held(settings, monkeypatch):
    """The batcher starts a batch (`launch_batch`) and collects it later on the same thread: the
    device is held in between (a benchmark waits) and given back on every path — results, one bad
    item failing alone, a lone bad item raising. A device left held would stall the worker."""
    from arrcoc.service.host.runtime import Runtime

    def free() -> bool:  # whether another thread can take the device now
        got = []

        def take() -> None:
            got.append(rt.device_lock.acquire(timeout=0.2))
            if got[0]:
                rt.device_lock.release()

        t = threading.Thread(target=take)
        t.start()
        t.join()
        return got[0]

    rt = Runtime(settings)
    try:
        good = [rt.prepare(png_bytes(i), "the sky", Controls()) for i in range(2)]
        wait = rt.launch_batch(good)
        assert not free(), "the device must be held until the batch is collected"
        results = wait()
        assert free() and [r.grid for r in results] == [results[0].grid] * 2
        assert [r.relevance.tolist() for r in results] == [r.relevance.tolist() for r in rt.pipeline.run(good)]

        launch = rt.pipeline.launch

        def refusing(requests):  # a batch holding a bad item fails as a whole; alone, it fails itself
            if any(r.query == "bad" for r in requests):
                raise InvalidInputError("a bad item")
            return launch(requests)

        monkeypatch.setattr(rt.pipeline, "launch", refusing)
        bad = dataclasses.replace(good[0], query="bad")
        out = rt.launch_batch([good[0], bad, good[1]])()
        assert free()
        assert isinstance(out[1], InvalidInputError) and out[0].grid == out[2].grid == results[0].grid
        with pytest.raises(InvalidInputError, match="a bad item"):
            rt.launch_batch([bad])
        assert free()
    finally:
        rt.close()


@pytest.fixture
def inprocess(settings):
    from arrcoc.service.client.inprocess import InProcessExecutor

    ex = InProcessExecutor(settings)
    yield ex
    ex.close()


def wait_finished(ex, job_id, timeout=120.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = ex.status(job_id)
        if st.state.finished:
            return st
        time.sleep(0.1)
    raise AssertionError(f"{job_id} did not finish: {st}")


def test_inprocess_infer_and_batch_job(inprocess):
    with pytest.raises(ImageError):
        inprocess.infer(b"not an image", "q")
    with pytest.raises(InvalidInputError, match="query"):
        inprocess.infer(png_bytes(0), "   ")
    r = inprocess.infer(png_bytes(0), "the red mug")
    assert r.query == "the red mug" and r.bucket == 1
    files = {f"img{i}.png": png_bytes(i) for i in range(5)} | {"broken.png": b"\x89PNG not really"}
    job = inprocess.submit_batch(make_zip(files), "the red mug")
    st = wait_finished(inprocess, job)
    assert (st.state, st.total, st.done, st.failed) == (JobState.DONE, 6, 5, 1)
    with zipfile.ZipFile(inprocess.batch_results(job)) as zf:
        rows = [json.loads(x) for x in zf.read("results.jsonl").splitlines()]
        assert [r["index"] for r in rows] == list(range(6))
        assert sum(not r["ok"] for r in rows) == 1 and len(zf.read("summary.csv").splitlines()) == 7
        assert len([n for n in zf.namelist() if n.startswith("overlays/")]) == 5
    # the in-process path matches a direct engine call
    r2 = inprocess.runtime.pipeline.infer([png_bytes(0)], "the red mug")[0]
    assert r.to_json()["selected"] == r2.to_json()["selected"]


def test_a_batch_job_without_overlays(settings, tmp_path):
    """ARRCOC_OVERLAY_FORMAT=none: every row, no pictures, summary.csv's overlay column empty."""
    from arrcoc.service.client.inprocess import InProcessExecutor

    ex = InProcessExecutor(settings.model_copy(update={"overlay_format": "none", "data_dir": tmp_path}))
    try:
        job = ex.submit_batch(make_zip({f"img{i}.png": png_bytes(i) for i in range(3)}), "the red mug")
        st = wait_finished(ex, job)
        assert (st.state, st.done, st.failed) == (JobState.DONE, 3, 0), st
        with zipfile.ZipFile(ex.batch_results(job)) as zf:
            assert not [n for n in zf.namelist() if n.startswith("overlays/")]
            assert len(zf.read("results.jsonl").splitlines()) == 3
            summary = list(csv.DictReader(io.StringIO(zf.read("summary.csv").decode())))
            assert [r["overlay"] for r in summary] == ["", "", ""] and {r["status"] for r in summary} == {"ok"}
    finally:
        ex.close()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_results_zip_written_as_the_job_runs_equals_one_built_from_its_parts(settings, tmp_path, writer, monkeypatch):
    """A job run whole writes results.zip as its parts come (either part writer); built again from
    the parts it is the same; parts out of order make the streamed zip give up, leaving nothing."""
    from arrcoc.service.client.inprocess import InProcessExecutor
    from arrcoc.service.jobs import batch
    from arrcoc.service.jobs.files import job_dir
    from arrcoc.service.jobs.parts import PART_SUFFIX
    from arrcoc.service.jobs.results_zip import ResultsZip, build_results_zip

    def content(path):
        with zipfile.ZipFile(path) as zf:
            assert zf.testzip() is None  # every member's CRC checks out
            return zf.namelist(), {n: zf.read(n) for n in zf.namelist()}

    s = settings.model_copy(update={"data_dir": tmp_path, "batch_writer": writer})
    ex = InProcessExecutor(s)
    try:
        monkeypatch.setattr(batch, "STEP_ITEMS", 8)  # several parts (a CPU's step is 8 items already)

        def not_built(jd):
            raise AssertionError("results.zip built again after the job instead of written as it ran")

        monkeypatch.setattr(batch, "build_results_zip", not_built)
        files = {f"img{i:02d}.png": png_bytes(i) for i in range(20)} | {"broken.png": b"\x89PNG not really"}
        job = ex.submit_batch(make_zip(files), "the red mug")
        st = wait_finished(ex, job)
        assert (st.state, st.done, st.failed) == (JobState.DONE, 20, 1), st
        jd = job_dir(s, job)
        parts = sorted((jd / "results").glob(f"*{PART_SUFFIX}"))
        assert len(parts) >= 3
        assert sorted(p.name for p in jd.iterdir() if p.name.startswith(".")) == []  # no spool left
        streamed = content(jd / "results.zip")
        assert len([n for n in streamed[0] if n.startswith("overlays/")]) == 20
        (jd / "results.zip").unlink()
        assert content(build_results_zip(jd)) == streamed
        out_of_order = ResultsZip(jd)
        out_of_order.add_part(parts[0])
        out_of_order.add_part(parts[2])
        assert not out_of_order.complete(21) and out_of_order.abandoned
        out_of_order.abandon()
        assert not out_of_order.path.exists()
        assert sorted(p.name for p in jd.iterdir() if p.name.startswith(".")) == []
    finally:
        ex.close()


def test_the_part_writer_outlives_its_child_process(tmp_path):
    """A writer child killed mid-job: the step is written in the caller's thread, the next one
    by a new child; no step is lost."""
    from arrcoc.service.host.interface import Processed
    from arrcoc.service.jobs import writer as part_writer
    from arrcoc.service.jobs.parts import PartReader

    (tmp_path / "results").mkdir()
    w = part_writer.PartWriter(process=True)
    failed = [Processed(error={"message": "bad"})]
    try:
        assert w.submit(tmp_path, [(0, "a.png", "q")], failed, "").result().marks == [(0, "bad")]
        for proc in list(part_writer._child()._processes.values()):
            proc.kill()
            proc.join(10)
        steps = []
        for i in (1, 2):
            steps.append(w.submit(tmp_path, [(i, f"{i}.png", "q")], failed, "").result())
        assert [s.marks for s in steps] == [[(1, "bad")], [(2, "bad")]]
        reader = PartReader()
        assert [reader.summaries(s.part)[0]["index"] for s in steps] == [1, 2]
        reader.close()
    finally:
        w.close()


def test_a_step_written_by_the_child_process_is_the_step_written_here(tmp_path, pipeline):
    """The child gets a step as columns (each result field stacked over the items, the texture
    left out: no part holds it): the part it writes holds the same rows, summaries and overlays,
    byte for byte, as the part written from the items themselves, failed items and differing K
    included."""
    from arrcoc.request import Controls
    from arrcoc.service.host.interface import Processed
    from arrcoc.service.jobs import writer as part_writer
    from arrcoc.service.jobs.parts import PartReader, write_step

    (tmp_path / "results").mkdir()
    results = pipeline.infer([png_bytes(i) for i in range(3)], "the red mug")
    other_k = pipeline.infer([png_bytes(3)], "the sky", Controls(k=7))[0]
    items = [Processed(result=results[0], overlay=b"jpeg-0"), Processed(error={"message": "bad"}),
             Processed(result=results[1], overlay=b"jpeg-2"), Processed(result=other_k, overlay=b"jpeg-3"),
             Processed(result=results[2], overlay=b"jpeg-4")]  # fmt: skip
    keys = [(i, f"{i}.png", "q") for i in range(len(items))]
    columns = part_writer.Columns.of(items)
    assert isinstance(columns.fields["relevance"], np.ndarray) and isinstance(columns.fields["selected"], list)
    assert "texture" not in columns.fields
    w = part_writer.PartWriter(process=True)
    try:
        there = w.submit(tmp_path, keys, items, ".jpg").result()
    finally:
        w.close()
    here = write_step(tmp_path, keys, items, ".jpg")
    assert there.marks == here.marks == [(0, None), (1, "bad"), (2, None), (3, None), (4, None)]
    reader = PartReader()
    try:
        assert reader.rows(there.part, 0, 5) == reader.rows(here.part, 0, 5)
        assert reader.summaries(there.part) == reader.summaries(here.part)
        for s in reader.summaries(here.part):
            if s["overlay"]:
                assert reader.picture(there.part, s["overlay"]) == reader.picture(here.part, s["overlay"])
    finally:
        reader.close()


def test_a_bad_query_in_a_manifest_fails_its_item_only(inprocess):
    manifest = "file,query\na.png,the sky\nb.png," + "sky " * 200 + "\nc.png,???\n"
    files = {"a.png": png_bytes(1), "b.png": png_bytes(2), "c.png": png_bytes(3), "manifest.csv": manifest.encode()}
    job = inprocess.submit_batch(make_zip(files))
    st = wait_finished(inprocess, job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 1, 2), st
    failed = inprocess.store.failed_items(job)
    assert "the limit is 500" in failed[1] and "no letters or digits" in failed[2]


def test_inprocess_cancel_and_bench(inprocess):
    gate = threading.Event()
    inprocess._jobs.submit(gate.wait)  # hold the job thread so the cancel lands before any chunk
    job = inprocess.submit_batch(make_zip({f"{i}.png": png_bytes(i) for i in range(6)}), "q")
    assert inprocess.cancel(job).state == JobState.CANCELLED
    gate.set()
    time.sleep(0.5)
    st = inprocess.status(job)
    assert st.state == JobState.CANCELLED and st.done == 0
    with pytest.raises(JobError):
        inprocess.bench_report(job)
    bench = inprocess.submit_bench(BenchRequest(backends=("eager",), buckets=(1,), iterations=2, warmup=1, device="cpu"))
    assert wait_finished(inprocess, bench).state == JobState.DONE
    report = inprocess.bench_report(bench)
    assert report["device_exclusive"]["held_ms"] > 0
    assert any(row.get("backend") == "eager" for row in report.get("results", [report]))


def test_an_item_that_keeps_killing_workers_fails_with_a_reason(inprocess, settings):
    from arrcoc.service.jobs import batch as jobs

    job, chunks = jobs.create_batch_job(make_zip({f"{i}.png": png_bytes(i) for i in range(3)}), "q", None,
                                        settings, inprocess.store)  # fmt: skip
    for _ in range(settings.max_redeliveries):  # three deliveries that each died on item 1
        inprocess.store.attempt(job, 1)
    for start, stop in chunks:
        jobs.run_chunk(job, start, stop, inprocess.runtime, inprocess.store, settings)
    st = inprocess.status(job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 2, 1)
    assert "the worker stopped each time" in inprocess.store.failed_items(job)[1]


def test_a_chunk_runs_one_step_at_a_time_and_holds_a_bounded_number_of_steps(inprocess, settings, monkeypatch):
    """In this process the engine runs one step at a time (IN_FLIGHT; on a GPU the next queued behind it), and
    however long the job and however slow the disk, the steps read but not yet written stay
    bounded (back-pressure); every item is recorded once."""
    from arrcoc.service.jobs import batch as jobs
    from arrcoc.service.jobs import writer

    lock = threading.Lock()
    seen = {"active": 0, "most_active": 0, "read": 0, "written": 0, "most_held": 0}
    real_read, real_write = jobs._read, writer.write_step

    def read(jd, items):
        with lock:
            seen["read"] += 1
            seen["most_held"] = max(seen["most_held"], seen["read"] - seen["written"])
        return real_read(jd, items)

    def write(*args):
        time.sleep(0.05)  # a slow disk: the job waits for it rather than reading on
        out = real_write(*args)
        with lock:
            seen["written"] += 1
        return out

    class CountedHost:  # the runtime, its engine calls counted
        def __getattr__(self, name):
            return getattr(inprocess.runtime, name)

        def process(self, *args, **kwargs):
            with lock:
                seen["active"] += 1
                seen["most_active"] = max(seen["most_active"], seen["active"])
            try:
                return inprocess.runtime.process(*args, **kwargs)
            finally:
                with lock:
                    seen["active"] -= 1

    monkeypatch.setattr(jobs, "_read", read)
    monkeypatch.setattr(writer, "write_step", write)
    steps = 10
    n = steps * jobs.step_items(inprocess.runtime)
    job, _ = jobs.create_batch_job(make_zip({f"{i}.png": png_bytes(i) for i in range(n)}), "q", None, settings,
                                   inprocess.store)  # fmt: skip
    jobs.run_chunk(job, 0, n, CountedHost(), inprocess.store, settings)
    st = inprocess.status(job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, n, 0)
    assert (seen["read"], seen["written"]) == (steps, steps)
    assert seen["most_active"] == 1
    # one being read, STEPS_QUEUED with the engine (one running), WRITE_QUEUE with the writer
    assert seen["most_held"] <= 1 + jobs.STEPS_QUEUED + jobs.WRITE_QUEUE < steps


@pytest.mark.parametrize("on_cpu", [False, True])
def test_the_engine_starts_the_next_step_while_the_last_is_handed_to_the_writer(inprocess, settings, monkeypatch,
                                                                               on_cpu):  # fmt: skip
    """With the engine on a GPU the next step waits queued behind the running one, so the engine
    host goes on to it as soon as the last returns, not after this thread has handed the last one
    to the part writer. With the engine on the CPU (whose cores it keeps busy) it is not queued."""
    from arrcoc.service.jobs import batch as jobs
    from arrcoc.service.jobs import writer

    events: list[tuple[str, int]] = []
    real_submit = writer.PartWriter.submit

    def submit(self, jd, keys, items, ext):
        step = keys[0][0] // jobs.step_items(inprocess.runtime)
        time.sleep(0.3)  # this thread busy handing the step over
        out = real_submit(self, jd, keys, items, ext)
        events.append(("handed", step))
        return out

    class Host:  # the runtime, each engine call's start noted; on a GPU or not, as the case says
        def __getattr__(self, name):
            return getattr(inprocess.runtime, name)

        @property
        def on_cpu(self) -> bool:
            return on_cpu

        def process(self, images, *args, **kwargs):
            events.append(("started", len([e for e in events if e[0] == "started"])))
            return inprocess.runtime.process(images, *args, **kwargs)

    monkeypatch.setattr(writer.PartWriter, "submit", submit)
    steps = 3
    n = steps * jobs.step_items(inprocess.runtime)
    job, _ = jobs.create_batch_job(make_zip({f"{i}.png": png_bytes(i) for i in range(n)}), "q", None, settings,
                                   inprocess.store)  # fmt: skip
    jobs.run_chunk(job, 0, n, Host(), inprocess.store, settings)
    assert inprocess.status(job).done == n
    for k in range(steps - 1):  # on a GPU step k+1 ran while step k was being handed over
        assert (events.index(("started", k + 1)) < events.index(("handed", k))) is not on_cpu, events


def test_inprocess_serves_each_backend_it_is_allowed(settings):
    """The backend chosen per request (demo dropdown, API) runs; one not served is a clear error."""
    from arrcoc.service.client.inprocess import InProcessExecutor

    s = settings.model_copy(update={"backends": ("eager", "onnx"), "buckets": (1,)})
    ex = InProcessExecutor(s)
    try:
        with pytest.raises(InvalidInputError, match="does not serve the 'compiled' backend"):
            ex.infer(png_bytes(0), "the red mug", backend="compiled")
        eager = ex.infer(png_bytes(0), "the red mug", backend="eager")
        onnx = ex.infer(png_bytes(0), "the red mug", backend="onnx")
        assert (eager.backend, onnx.backend) == ("eager", "onnx")
        assert abs(eager.relevance - onnx.relevance).max() <= 1e-3
        assert set(eager.selected.tolist()) == set(onnx.selected.tolist())
        assert ex.runtime.pipeline_for("onnx").model is ex.runtime.pipeline_for("eager").model
    finally:
        ex.close()


def test_list_settings_read_from_the_environment_as_commas_or_json(monkeypatch):
    from pydantic import ValidationError

    from arrcoc.settings import Settings

    monkeypatch.setenv("ARRCOC_BACKENDS", "eager, onnx")
    monkeypatch.setenv("ARRCOC_BUCKETS", "[8, 1, 2]")
    s = Settings()
    assert s.backends == ("eager", "onnx") and s.buckets == (1, 2, 8)
    monkeypatch.setenv("ARRCOC_BACKENDS", "eager,tensorrt")
    with pytest.raises(ValidationError, match="ARRCOC_BACKENDS must name some of eager, compiled, onnx"):
        Settings()
