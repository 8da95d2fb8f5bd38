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
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import BROKER, make_zip, png_bytes, seeded_weights
from PIL import Image

from arrcoc.bench.processes import REPO
from arrcoc.errors import DeadlineExceeded, ImageError, InvalidInputError, JobError
from arrcoc.request import Controls
from arrcoc.service.host.batching import DynamicBatcher
from arrcoc.service.jobs.archive import load_items, unpack
from arrcoc.service.jobs.store import MemoryJobStore, RedisJobStore, redis_client
from arrcoc.service.jobs.types import BenchRequest, JobKind, JobState
from arrcoc.settings import default_settings


@pytest.fixture
def settings(tmp_path):
    return default_settings(
        service={"data_dir": tmp_path / "data"},
        engine={"buckets": (1, 2, 4), "weights": str(seeded_weights(tmp_path / "w.safetensors"))},
        limits={"max_batch_items": 100},
    )


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
        (
            make_zip({"a.png": png_bytes(0), "manifest.csv": b"file,query\na.png,x\nb.png,y\n"}),
            None,
            "lacks: b.png",
        ),
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
    items = unpack(
        make_zip(
            {"b.png": png_bytes(1), "a.jpg": png_bytes(0), "x/readme.txt": b"", "__MACOSX/._a.jpg": b""}
        ),
        "the mug",
        tmp_path / "j1",
        settings,
    )
    assert [(i.file, i.query) for i in items] == [("a.jpg", "the mug"), ("b.png", "the mug")]
    assert [i.file for i in load_items(tmp_path / "j1")] == ["a.jpg", "b.png"]
    csv = b"file,query\nb.png,a cat\na.jpg,\n"
    items = unpack(
        make_zip({"a.jpg": png_bytes(0), "b.png": png_bytes(1), "manifest.csv": csv}),
        "default",
        tmp_path / "j2",
        settings,
    )
    assert [(i.file, i.query) for i in items] == [("b.png", "a cat"), ("a.jpg", "default")]
    jsonl = b'{"file": "d/a.jpg", "query": "sky"}\n\n{"file": "d/a.jpg", "query": "sea"}\n'
    items = unpack(
        make_zip({"d/a.jpg": png_bytes(0), "manifest.jsonl": jsonl}), None, tmp_path / "j3", settings
    )
    assert [i.query for i in items] == ["sky", "sea"]
    with pytest.raises(InvalidInputError, match="limit is 100"):
        unpack(make_zip({f"{i}.png": b"x" for i in range(101)}), "q", tmp_path / "j4", settings)


# -- the dynamic batcher ---------------------------------------------------------------------
class StandIn:
    """The stages a batcher runs its batches through (arrcoc.service.host.stages.Stages) as plain
    functions: `run` runs a batch at once; `launch` starts it and returns its wait; with `overlap`
    the batcher gathers and decodes the next batch while the last one runs."""

    def __init__(self, run=None, decode=None, launch=None, overlap=False):
        self.run, self.launch, self.overlap = run, launch, overlap
        self.decode = decode or (lambda items: items)

    def engine(self, items):
        if self.launch is not None:
            return self.launch(items)
        results = self.run(items)
        return lambda: results


def test_batcher_coalesces_concurrent_requests_and_keeps_order():
    seen: list[int] = []

    def run(items):
        seen.append(len(items))
        time.sleep(0.02)
        return [ValueError(f"bad {x}") if x == 13 else x * 10 for x in items]

    b = DynamicBatcher(StandIn(run), max_batch=8, max_delay_s=0.05)
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
        b = DynamicBatcher(StandIn(lambda items: items), max_batch=8, max_delay_s=1.0, idle_wait=idle_wait)
        for i in range(2):  # the first, and one after a batch of one
            t0 = time.perf_counter()
            assert b.submit(i).result(10) == i
            assert at_least <= time.perf_counter() - t0 < at_most, (idle_wait, i)
        b.close()


def test_batcher_off_runs_one_at_a_time():
    sizes = []
    b = DynamicBatcher(
        StandIn(lambda items: sizes.append(len(items)) or items), max_batch=1, max_delay_s=0.01
    )
    threads = [threading.Thread(target=lambda i=i: b.submit(i).result(5)) for i in range(10)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sizes == [1] * 10
    b.close()


def test_pipelined_batcher_gathers_the_next_batch_while_the_device_runs_one():
    """With overlap (a GPU decodes a batch's JPEGs) one thread starts batch k on the device,
    gathers batch k+1 from what arrived meanwhile, hands batch k out, then decodes batch k+1; an item
    that fails to decode fails alone; every other caller gets its own result."""
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
    b = DynamicBatcher(
        StandIn(decode=prepare, launch=launch, overlap=True),
        max_batch=8,
        max_delay_s=0.05,
        idle_wait=True,
        name="pipelined",
    )
    futures.extend(b.submit(i) for i in range(4))
    assert [f.result(5) for f in futures[:4]] == [0, 10, 20, 30]
    deadline = time.monotonic() + 5
    while len(futures) < 12 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert [f.result(5) for i, f in enumerate(futures) if i != 7] == [i * 10 for i in range(12) if i != 7]
    with pytest.raises(ValueError, match="undecodable 7"):
        futures[7].result(5)
    assert log == [
        ("prepare", [0, 1, 2, 3]),
        ("launch", [0, 1, 2, 3]),
        ("wait", [0, 1, 2, 3]),
        ("prepare", list(range(4, 12))),
        ("launch", [4, 5, 6, 8, 9, 10, 11]),
        ("wait", [4, 5, 6, 8, 9, 10, 11]),
    ], log
    assert threads == {"pipelined"}
    # a lone request with the device idle: prepared, started and handed out at once
    lone = DynamicBatcher(
        StandIn(lambda items: [threading.current_thread().name for _ in items], prepare, overlap=True),
        name="lone",
    )
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

    b = DynamicBatcher(StandIn(run, overlap=True), max_batch=8, max_delay_s=2.0)
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
    assert store.item_finished("batch-0000000000000001", 1) and not store.item_finished(
        "batch-0000000000000001", 2
    )
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
        assert owner.process([png_bytes(3)], ["the sky"], Controls(), "jpeg").result(0) is not None
    finally:
        owner.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_steps_at_once_on_the_gpu_get_what_each_gets_alone():
    """Engine calls start while earlier ones still run, each step thread on its own CUDA stream,
    all into the same captured graphs (arrcoc.engine.cuda_graph orders their uses on the device):
    steps run at once on the runtime's step threads, as a job runs them, give bit for bit what
    each gives alone — steps over the largest bucket, within it, and of odd sizes. A missing wait
    between two calls' uses of the graphs' buffers shows as rows of another step."""
    from arrcoc.service.host.runtime import Runtime

    def jpeg(seed: int) -> bytes:
        out = io.BytesIO()
        Image.open(io.BytesIO(png_bytes(seed, size=160))).convert("RGB").save(out, "JPEG")
        return out.getvalue()

    rt = Runtime(
        default_settings(engine={"device": "cuda", "backend": "compiled", "backends": ("compiled",)})
    )
    try:
        rt.warm()
        photos = [jpeg(i) for i in range(600)]
        queries = [("the sky", "a red car", "green grass", "a face", "water")[i % 5] for i in range(600)]
        fields = ("relevance", "selected", "budgets", "budget_map", "match_score")
        for size in (128, 200, 37):
            spans = [(lo, min(len(photos), lo + size)) for lo in range(0, len(photos), size)]

            def step(span: tuple[int, int]):
                return rt.process(photos[span[0] : span[1]], queries[span[0] : span[1]], Controls(), "none")

            alone = [step(span) for span in spans]
            together = list(rt.step_pool.map(step, spans))
            for a, b in zip(alone, together, strict=True):
                assert all(b.outputs.ok) and all(
                    np.array_equal(getattr(a.outputs, f), getattr(b.outputs, f)) for f in fields
                ), f"a step of {size} differs when run beside others"
    finally:
        rt.close()


def test_the_device_is_held_while_a_batch_starts_and_never_left_held(settings, monkeypatch):
    """The engine stage starts a batch (`Stages.engine`) and collects it later on the same thread:
    the device is given back once the batch has started (the next may start while it runs), on
    every path — results, one bad item failing alone, a lone bad item. A device left held would
    stall the worker."""
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
        stages = rt.stages_for(None)
        good = [rt.prepare(png_bytes(i), "the sky", Controls()) for i in range(2)]
        wait = stages.engine(good)
        assert free(), "the next batch may start while this one runs"
        results = [r() for r in wait()]
        assert free() and [r.grid for r in results] == [results[0].grid] * 2
        assert [r.relevance.tolist() for r in results] == [
            r.relevance.tolist() for r in rt.pipeline.run(good)
        ]

        launch = rt.pipeline.launch

        def refusing(requests):  # a batch holding a bad item fails as a whole; alone, it fails itself
            if any(r.query == "bad" for r in requests):
                raise InvalidInputError("a bad item")
            return launch(requests)

        monkeypatch.setattr(rt.pipeline, "launch", refusing)
        bad = dataclasses.replace(good[0], query="bad")
        out = stages.engine([good[0], bad, good[1]])()
        assert free()
        assert isinstance(out[1], InvalidInputError) and out[0]().grid == out[2]().grid == results[0].grid
        [alone] = stages.engine([bad])()
        assert isinstance(alone, InvalidInputError) and free()
    finally:
        rt.close()


def test_one_bad_item_in_an_engine_call_fails_alone_on_both_paths(settings, monkeypatch, caplog):
    """An engine call that raises for one item (a tokenizer refusing its query: the encoder runs
    inside the engine call) runs again item by item through the one isolation function
    (arrcoc.isolation.isolated), whichever way the batch came: gathered from
    concurrent interactive requests, or a batch job's step. The bad item gets its error, its
    neighbours the results they get without it."""
    from arrcoc.service.host.runtime import Runtime

    # four interactive requests wait for each other (idle_wait, a long delay) and go as one batch
    rt = Runtime(settings.replace(batching={"max_size": 4, "max_delay_ms": 30_000, "idle_wait": True}))
    try:
        images = [png_bytes(i) for i in range(4)]
        queries = ["the sky", "the sea", "refused", "the mug"]
        expected = rt.pipeline.infer(
            [images[i] for i in (0, 1, 3)], [queries[i] for i in (0, 1, 3)]
        )  # before the stand-in: the neighbours' own results
        encode = rt.pipeline.encoder.encode

        def tokenizer(texts):
            if "refused" in ([texts] if isinstance(texts, str) else texts):
                raise TypeError("the tokenizer refused a query")
            return encode(texts)

        monkeypatch.setattr(rt.pipeline.encoder, "encode", tokenizer)
        caplog.set_level("WARNING", logger="arrcoc.isolation")

        def ask(i):
            try:
                return rt.infer(images[i], queries[i], Controls(), 60)
            except Exception as e:  # noqa: BLE001 -- the bad item's error is what is asserted
                return e

        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(ask, range(4)))
        assert isinstance(got[2], TypeError) and "refused" in str(got[2])
        for r, want in zip([got[i] for i in (0, 1, 3)], expected, strict=True):
            assert r.query == want.query and np.allclose(r.relevance, want.relevance, atol=1e-5)
        assert "batch of 4 failed (TypeError" in caplog.text

        caplog.clear()
        step = rt.process(images, queries, Controls(), "none")
        assert step.outputs.ok.tolist() == [True, True, False, True]
        assert step.errors[2] is not None and "refused" in step.errors[2]
        assert [e for i, e in enumerate(step.errors) if i != 2] == [None] * 3
        for i, want in zip((0, 1, 3), expected, strict=True):
            assert np.allclose(step.outputs.relevance[i], want.relevance, atol=1e-5)
        assert "batch of 4 failed (TypeError" in caplog.text
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
    job = inprocess.submit_batch(make_zip(files), "the red mug", overlays="relevance")
    st = wait_finished(inprocess, job)
    assert (st.state, st.total, st.done, st.failed) == (JobState.DONE, 6, 5, 1)
    with zipfile.ZipFile(inprocess.batch_results(job)) as zf:
        rows = pq.read_table(io.BytesIO(zf.read("results.parquet"))).to_pylist()
        assert [r["index"] for r in rows] == list(range(6))
        assert sum(r["status"] != "ok" for r in rows) == 1 and len(zf.read("summary.csv").splitlines()) == 7
        assert len([n for n in zf.namelist() if n.startswith("overlays/")]) == 5
    # the in-process path matches a direct engine call
    r2 = inprocess.runtime.pipeline.infer([png_bytes(0)], "the red mug")[0]
    assert r.to_json()["selected"] == r2.to_json()["selected"]


def test_a_batch_job_without_overlays(settings, tmp_path):
    """A job that asks for no overlays (the default for programs): every row, no pictures,
    summary.csv's overlay column empty; a bad choice is refused naming the option."""
    from arrcoc.service.client.inprocess import InProcessExecutor

    ex = InProcessExecutor(settings.replace(service={"data_dir": tmp_path}))
    try:
        with pytest.raises(InvalidInputError, match="overlays must be one of none, relevance, foveated"):
            ex.submit_batch(make_zip({"a.png": png_bytes(0)}), "the red mug", overlays="heatmap")
        job = ex.submit_batch(make_zip({f"img{i}.png": png_bytes(i) for i in range(3)}), "the red mug")
        st = wait_finished(ex, job)
        assert (st.state, st.done, st.failed) == (JobState.DONE, 3, 0), st
        with zipfile.ZipFile(ex.batch_results(job)) as zf:
            assert not [n for n in zf.namelist() if n.startswith("overlays/")]
            assert pq.read_metadata(io.BytesIO(zf.read("results.parquet"))).num_rows == 3
            summary = list(csv.DictReader(io.StringIO(zf.read("summary.csv").decode())))
            assert [r["overlay"] for r in summary] == ["", "", ""] and {r["status"] for r in summary} == {
                "ok"
            }
    finally:
        ex.close()


def test_a_batch_job_can_draw_the_foveated_view_and_lists_the_selected_boxes(settings, tmp_path):
    """overlay_kind "foveated": each item's overlay is arrcoc.foveate of its photo under the item's
    own budget map as results.parquet holds it (PNG overlays: max |delta| <= 1 level, the uint8
    rounding of the same floats drawn in a batch or alone), photos of two sizes in one step;
    results.parquet's selected_boxes are the items' `selected_boxes` of `arrcoc infer --json`.
    A bad kind is refused before anything is queued, naming the option."""
    import torch
    from PIL import Image

    from arrcoc.foveate import foveate
    from arrcoc.service.client.inprocess import InProcessExecutor

    photo = (REPO / "arrcoc" / "examples" / "coffee.jpg").read_bytes()  # 600 x 400: cells not whole pixels
    files = {
        "a.png": png_bytes(1, 256),
        "b.jpg": photo,
        "c.png": png_bytes(2, 256),
        "d.png": b"\x89PNG not really",
    }
    ex = InProcessExecutor(settings.replace(jobs={"overlay_format": "png"}, service={"data_dir": tmp_path}))
    try:
        with pytest.raises(InvalidInputError, match="overlays must be one of none, relevance, foveated"):
            ex.submit_batch(make_zip(files), "the red mug", overlays="heatmap")
        job = ex.submit_batch(make_zip(files), "the red mug", overlays="foveated")
        st = wait_finished(ex, job)
        assert (st.state, st.done, st.failed) == (JobState.DONE, 3, 1), st
        with zipfile.ZipFile(ex.batch_results(job)) as zf:
            table = pq.read_table(io.BytesIO(zf.read("results.parquet")))
            pictures = {
                n: np.asarray(Image.open(io.BytesIO(zf.read(n))))
                for n in zf.namelist()
                if n.startswith("overlays/")
            }
        assert table.schema.metadata[b"arrcoc.selected_boxes_format"] == b"x0,y0,x1,y1,tokens"
        rows = table.to_pylist()
        pipe = ex.runtime.pipeline
        for row, name in zip(rows[:3], ("a.png", "b.jpg", "c.png"), strict=True):
            original = np.array(Image.open(io.BytesIO(files[name])).convert("RGB"))
            budget_map = torch.tensor(row["budget_map"]).view(1, 32, 32)
            expected = foveate(torch.from_numpy(original).permute(2, 0, 1)[None].contiguous(), budget_map)[0]
            drawn = pictures[row["overlay"]]
            assert drawn.shape == original.shape
            delta = np.abs(drawn.astype(int) - expected.permute(1, 2, 0).numpy().astype(int)).max()
            assert delta <= 1, (name, delta)
            assert np.abs(drawn.astype(int) - original.astype(int)).max() > 10  # unselected cells are blurred
            boxes = np.asarray(row["selected_boxes"]).reshape(-1, 5)
            assert boxes.tolist() == pipe.infer([files[name]], "the red mug")[0].selected_boxes.tolist(), name
        assert (
            rows[3]["status"] == "failed" and rows[3]["selected_boxes"] is None and rows[3]["overlay"] is None
        )
    finally:
        ex.close()


def test_results_zip_written_as_the_job_runs_equals_one_built_from_its_parts(settings, tmp_path, monkeypatch):
    """A job run whole writes results.zip as its parts come; built again from the parts it is the
    same; each picture is on disk once; steps out of order make the streamed zip give up, leaving
    nothing."""
    from arrcoc.service.client.inprocess import InProcessExecutor
    from arrcoc.service.jobs import batch, finishing
    from arrcoc.service.jobs.budget import folder_bytes
    from arrcoc.service.jobs.files import job_dir
    from arrcoc.service.jobs.parts import PART_SUFFIX, read_part
    from arrcoc.service.jobs.results_zip import ResultsZip, build_results_zip

    def content(path):
        with zipfile.ZipFile(path) as zf:
            assert zf.testzip() is None  # every member's CRC checks out
            names = zf.namelist()
            table = pq.read_table(io.BytesIO(zf.read("results.parquet")))
            return names, {n: zf.read(n) for n in names if n != "results.parquet"}, table

    s = settings.replace(service={"data_dir": tmp_path})
    ex = InProcessExecutor(s)
    try:
        monkeypatch.setattr(batch, "STEP_ITEMS", 8)  # several parts (a CPU's step is 8 items already)

        def not_built(jd, jsonl=False):
            raise AssertionError("results.zip built again after the job instead of written as it ran")

        monkeypatch.setattr(finishing, "build_results_zip", not_built)
        files = {f"img{i:02d}.png": png_bytes(i) for i in range(20)} | {"broken.png": b"\x89PNG not really"}
        job = ex.submit_batch(make_zip(files), "the red mug", overlays="relevance")
        st = wait_finished(ex, job)
        assert (st.state, st.done, st.failed) == (JobState.DONE, 20, 1), st
        jd = job_dir(s, job)
        parts = sorted((jd / "results").glob(f"*{PART_SUFFIX}"))
        assert len(parts) >= 3
        assert sorted(p.name for p in jd.iterdir() if p.name.startswith(".")) == []  # no spool left
        streamed = content(jd / "results.zip")
        assert len([n for n in streamed[0] if n.startswith("overlays/")]) == 20
        # each picture is on disk once: in the file that results.zip is a second name for, not in a part
        for part in parts:
            with zipfile.ZipFile(part) as zf:
                assert not [n for n in zf.namelist() if n.startswith("overlays/")]
        named = {read_part(part).pictures.file for part in parts}
        assert len(named) == 1 and (jd / named.pop()).samefile(jd / "results.zip")
        files = [f for f in jd.rglob("*") if f.is_file() and f.name != "reserved.json"]
        assert folder_bytes(jd) == sum(f.stat().st_size for f in files) - (jd / "results.zip").stat().st_size
        assert not (jd / "results.parquet").exists()  # the rows are stored once: in results.zip
        (jd / "results.zip").unlink()
        rebuilt = content(build_results_zip(jd))
        assert rebuilt[:2] == streamed[:2] and rebuilt[2].equals(streamed[2])
        out_of_order = ResultsZip(jd)
        assert (
            out_of_order.add_pictures([8, 9], [None, None], [None, None]) is None
        )  # not where the results begin
        assert not out_of_order.complete(21) and out_of_order.abandoned
        out_of_order.abandon()
        assert not out_of_order.path.exists()
        assert sorted(p.name for p in jd.iterdir() if p.name.startswith(".")) == []
    finally:
        ex.close()


def test_results_parquet_holds_the_per_item_results_one_row_group_per_step(inprocess, settings):
    """results.parquet's schema (fixed-size float32 maps, K cells and budgets) and content equal
    what the pipeline gives each item (maps within 1e-5, cells and budgets exact), failed items as
    null rows with their reasons, one row group per step; pandas reads it as it is; the opt-in
    results.jsonl holds the same rows."""
    import pandas as pd
    import pyarrow as pa

    from arrcoc.service.jobs import batch as jobs
    from arrcoc.service.jobs.results import parquet_to_jsonl

    step = jobs.step_items(inprocess.runtime)
    n = step + 2
    images = [png_bytes(i) for i in range(n - 1)]
    files = {f"img{i:02d}.png": data for i, data in enumerate(images)} | {
        "zz_broken.png": b"\x89PNG not really"
    }
    job = inprocess.submit_batch(make_zip(files), "the red mug", overlays="relevance")
    assert wait_finished(inprocess, job).state == JobState.DONE
    with zipfile.ZipFile(inprocess.batch_results(job)) as zf:
        f = pq.ParquetFile(io.BytesIO(zf.read("results.parquet")))
        overlays = {m for m in zf.namelist() if m.startswith("overlays/")}
    assert f.num_row_groups == 2 and [f.metadata.row_group(g).num_rows for g in range(2)] == [step, 2]
    table = f.read()
    schema = table.schema
    for name in ("relevance", "information", "perspectival", "participatory", "budget_map"):
        assert schema.field(name).type == pa.list_(pa.float32(), 32 * 32), name
    assert schema.field("selected").type == pa.list_(pa.int32(), 200) and schema.field(
        "budgets"
    ).type == pa.list_(pa.int32(), 200)
    assert schema.field("selected_boxes").type == pa.list_(pa.int32(), 200 * 5)
    assert schema.metadata[b"arrcoc.schema"] == b"arrcoc.batch.results/1"
    pipe = inprocess.runtime.pipeline
    # the engine's own batches: the job's first step, then the second step's one good item
    expected = pipe.infer(images[:step], "the red mug") + pipe.infer(images[step:], "the red mug")
    df = table.to_pandas()
    assert list(df["index"]) == list(range(n)) and list(df["status"]) == ["ok"] * (n - 1) + ["failed"]
    for i, r in enumerate(expected):
        row = df.iloc[i]
        for name in ("relevance", "information", "perspectival", "participatory", "budget_map"):
            np.testing.assert_allclose(row[name].reshape(32, 32), getattr(r, name), atol=1e-5, err_msg=name)
        assert (
            row["selected"].tolist() == r.selected.tolist() and row["budgets"].tolist() == r.budgets.tolist()
        )
        assert (
            row["match_score"] == pytest.approx(r.match_score, abs=1e-6) and row["weak_match"] == r.weak_match
        )
        assert (row["image_width"], row["image_height"]) == r.image_size and row[
            "tokens_used"
        ] == r.budgets.sum()
        assert row["overlay"] in overlays and pd.isna(row["error"])
        assert row["selected_boxes"].reshape(-1, 5).tolist() == r.selected_boxes.tolist()
    bad = df.iloc[n - 1]
    assert bad["relevance"] is None and pd.isna(bad["overlay"]) and "not an image format" in bad["error"]
    out = io.BytesIO()
    assert parquet_to_jsonl(io.BytesIO(pq_bytes(table)), out) == n
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["index"] for x in lines] == list(range(n)) and lines[-1]["relevance"] is None
    np.testing.assert_allclose(lines[0]["relevance"], expected[0].relevance, atol=1e-5)
    assert lines[0]["selected"] == expected[0].selected.tolist() and lines[0]["file"] == "img00.png"
    assert lines[0]["selected_boxes"] == expected[0].selected_boxes.tolist()


def pq_bytes(table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


@pytest.mark.parametrize("stopped", ["exited", "killed"])
def test_a_redelivered_chunk_leaves_every_item_once(inprocess, settings, monkeypatch, stopped):
    """A worker that wrote a step's part and died before recording it: the chunk delivered again
    writes those items again; results.parquet and summary.csv hold each item exactly once (the
    later part's row), every picture whole, also those the first worker wrote straight into the
    results.zip it was writing and never closed (killed: nothing of it ran after)."""
    from arrcoc.service.jobs import batch as jobs
    from arrcoc.service.jobs.results_zip import ResultsZip

    if stopped == "killed":
        monkeypatch.setattr(ResultsZip, "abandon", lambda self: None)

    step = jobs.step_items(inprocess.runtime)
    n = 2 * step + 3
    job, chunks, _ = jobs.create_batch_job(
        make_zip({f"{i:02d}.png": png_bytes(i) for i in range(n)}),
        "q",
        None,
        settings,
        inprocess.store,
        overlays="relevance",
    )
    real_mark = inprocess.store.mark_items
    calls = {"n": 0}

    def dies_on_the_second_step(job_id, marks):
        calls["n"] += 1
        if calls["n"] == 2:
            raise SystemExit("the worker died")  # the part is on disk, its items unrecorded
        return real_mark(job_id, marks)

    monkeypatch.setattr(inprocess.store, "mark_items", dies_on_the_second_step)
    with pytest.raises(SystemExit):
        jobs.run_chunk(job, 0, n, inprocess.runtime, inprocess.store, settings)
    assert inprocess.status(job).done == step
    monkeypatch.undo()
    for start, stop in chunks:  # delivered again
        jobs.run_chunk(job, start, stop, inprocess.runtime, inprocess.store, settings)
    st = inprocess.status(job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, n, 0)
    with zipfile.ZipFile(inprocess.batch_results(job)) as zf:
        table = pq.read_table(io.BytesIO(zf.read("results.parquet")))
        summary = list(csv.DictReader(io.StringIO(zf.read("summary.csv").decode())))
        assert len([m for m in zf.namelist() if m.startswith("overlays/")]) == n
        assert zf.testzip() is None  # every picture's bytes match its CRC
        assert all(Image.open(io.BytesIO(zf.read(m))).size for m in table["overlay"].to_pylist())
    assert table["index"].to_pylist() == list(range(n)) and [int(r["index"]) for r in summary] == list(
        range(n)
    )
    assert set(table["status"].to_pylist()) == {"ok"}


def test_a_bad_query_in_a_manifest_fails_its_item_only(inprocess):
    manifest = "file,query\na.png,the sky\nb.png," + "sky " * 200 + "\nc.png,???\n"
    files = {
        "a.png": png_bytes(1),
        "b.png": png_bytes(2),
        "c.png": png_bytes(3),
        "manifest.csv": manifest.encode(),
    }
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
    bench = inprocess.submit_bench(
        BenchRequest(backends=("eager",), buckets=(1,), iterations=2, warmup=1, device="cpu")
    )
    assert wait_finished(inprocess, bench).state == JobState.DONE
    report = inprocess.bench_report(bench)
    assert report["device_exclusive"]["held_ms"] > 0
    assert any(row.get("backend") == "eager" for row in report.get("results", [report]))


def test_an_item_that_keeps_killing_workers_fails_with_a_reason(inprocess, settings):
    from arrcoc.service.jobs import batch as jobs

    job, chunks, _ = jobs.create_batch_job(
        make_zip({f"{i}.png": png_bytes(i) for i in range(3)}), "q", None, settings, inprocess.store
    )
    for _ in range(settings.jobs.max_redeliveries):  # three deliveries that each died on item 1
        inprocess.store.attempt(job, 1)
    for start, stop in chunks:
        jobs.run_chunk(job, start, stop, inprocess.runtime, inprocess.store, settings)
    st = inprocess.status(job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 2, 1)
    assert "the worker stopped each time" in inprocess.store.failed_items(job)[1]


@pytest.mark.parametrize(("in_flight", "on_cpu"), [(1, False), (2, False), (3, False), (2, True)])
def test_a_chunk_holds_a_bounded_number_of_steps(inprocess, settings, monkeypatch, in_flight, on_cpu):
    """At most `batching.steps_in_flight` steps at once on an accelerator (with two, one step is
    written while the next runs), one on a CPU, never more: however long the job and however slow
    the disk, the steps held stay bounded; every item is recorded once, in order. (The host is this
    CPU runtime, told it is on an accelerator where `on_cpu` is False: CI has no GPU.)"""
    from arrcoc.service.jobs import batch as jobs

    settings = settings.replace(batching={"steps_in_flight": in_flight})
    lock = threading.Lock()
    seen = {
        "active": 0,
        "most_active": 0,
        "read": 0,
        "written": 0,
        "most_held": 0,
        "written_while_running": 0,
    }
    real_read, real_write = jobs._read, jobs.write_part

    def read(jd, items, pending=None):
        with lock:
            seen["read"] += 1
            seen["most_held"] = max(seen["most_held"], seen["read"] - seen["written"])
        return real_read(jd, items, pending)

    def write(*args):
        time.sleep(0.05)  # a slow disk: the job waits for it rather than reading on
        with lock:
            seen["written_while_running"] += seen["active"]
        out = real_write(*args)
        with lock:
            seen["written"] += 1
        return out

    pool = ThreadPoolExecutor(in_flight, thread_name_prefix="arrcoc-step")

    class CountedHost:  # the runtime, its engine calls counted, its step threads as many as asked
        def __getattr__(self, name):
            return getattr(inprocess.runtime, name)

        step_pool = pool

        @property
        def on_cpu(self):
            return on_cpu

        def process(self, *args, **kwargs):
            with lock:
                seen["active"] += 1
                seen["most_active"] = max(seen["most_active"], seen["active"])
            try:
                time.sleep(0.05)  # the step runs long enough for the next one to start
                return inprocess.runtime.process(*args, **kwargs)
            finally:
                with lock:
                    seen["active"] -= 1

    monkeypatch.setattr(jobs, "_read", read)
    monkeypatch.setattr(jobs, "write_part", write)
    steps = 6
    n = steps * jobs.step_items(inprocess.runtime)
    job, _, _ = jobs.create_batch_job(
        make_zip({f"{i}.png": png_bytes(i) for i in range(n)}), "q", None, settings, inprocess.store
    )
    jobs.run_chunk(job, 0, n, CountedHost(), inprocess.store, settings)
    st = inprocess.status(job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, n, 0)
    at_once = 1 if on_cpu else in_flight
    # steps side by side start and end on smaller ones (batch.steps_of): 3 + 4 + 3 of the 6
    cut = steps + 4 if at_once > 1 else steps
    assert (seen["read"], seen["written"]) == (cut, cut)
    assert seen["most_active"] == at_once  # the steps overlap, as many as asked and no more
    assert seen["most_held"] <= at_once  # read and not yet written: the steps in flight
    assert (seen["written_while_running"] >= 1) == (at_once > 1)  # one written while the next runs
    from arrcoc.service.jobs.files import job_dir

    with zipfile.ZipFile(job_dir(settings, job) / "results.zip") as zf:
        rows = pq.read_table(io.BytesIO(zf.read("results.parquet")), columns=["index"])
    assert rows["index"].to_pylist() == list(range(n))


def test_inprocess_serves_each_backend_it_is_allowed(settings):
    """The backend chosen per request (demo dropdown, API) runs; one not served is a clear error."""
    from arrcoc.service.client.inprocess import InProcessExecutor

    s = settings.replace(engine={"backends": ("eager", "onnx"), "buckets": (1,)})
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

    monkeypatch.setenv("ARRCOC_ENGINE__BACKENDS", "eager, onnx")
    monkeypatch.setenv("ARRCOC_ENGINE__BUCKETS", "[8, 1, 2]")
    s = Settings()
    assert s.engine.backends == ("eager", "onnx") and s.engine.buckets == (1, 2, 8)
    monkeypatch.setenv("ARRCOC_ENGINE__BACKENDS", "eager,tensorrt")
    with pytest.raises(
        ValidationError, match="ARRCOC_ENGINE__BACKENDS must name some of eager, compiled, onnx"
    ):
        Settings()


def test_results_jsonl_is_in_the_zip_when_asked_with_the_parquet_files_rows(settings, tmp_path):
    """ARRCOC_JOBS__RESULTS_JSONL=1: results.jsonl beside results.parquet, the same rows in the same order."""
    from arrcoc.service.client.inprocess import InProcessExecutor

    ex = InProcessExecutor(settings.replace(jobs={"results_jsonl": True}, service={"data_dir": tmp_path}))
    try:
        job = ex.submit_batch(
            make_zip({f"img{i}.png": png_bytes(i) for i in range(3)} | {"x.png": b"no"}), "the sky"
        )
        assert wait_finished(ex, job).state == JobState.DONE
        with zipfile.ZipFile(ex.batch_results(job)) as zf:
            lines = [json.loads(x) for x in zf.read("results.jsonl").splitlines()]
            table = pq.read_table(io.BytesIO(zf.read("results.parquet")))
        assert [x["file"] for x in lines] == table["file"].to_pylist() and len(lines) == 4
        ok = next(x for x in lines if x["status"] == "ok")
        assert np.asarray(ok["relevance"]).shape == (32, 32) and len(ok["selected"]) == ok["k"]
    finally:
        ex.close()


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_summary_csv_cells_a_spreadsheet_would_run_are_neutralised(start):
    """summary.csv's text cells (file, query, error) starting as a formula would are prefixed with
    a quote (OWASP's CSV injection guidance); results.parquet keeps the text as it was."""
    from arrcoc.service.host.interface import StepOutputs
    from arrcoc.service.jobs.results import step_table, write_summary

    text = f'{start}HYPERLINK("http://x")'
    table = step_table(
        [(0, f"{text}.jpg", text), (1, "plain.jpg", "a query")],
        StepOutputs.failed(2, 32, 2),
        [text, "fine"],
        [None, None],
    )
    out = io.BytesIO()
    write_summary(table, out, header=True)
    rows = list(csv.DictReader(io.StringIO(out.getvalue().decode())))
    assert [rows[0][k] for k in ("file", "query", "error")] == [f"'{text}.jpg", f"'{text}", f"'{text}"]
    assert (rows[1]["file"], rows[1]["query"]) == ("plain.jpg", "a query")
    assert table["file"][0].as_py() == f"{text}.jpg"


def test_a_step_holds_at_most_step_bytes_of_input(inprocess, settings, monkeypatch):
    """Steps end at STEP_BYTES of input as well as at their item count (an item larger than that
    goes alone): a job of large photos holds a bounded amount of them in memory; every item is
    still run and recorded once, in order."""
    from arrcoc.service.jobs import batch as jobs

    photos = {f"{i:02d}.png": png_bytes(i, size=40 + 8 * (i % 3)) for i in range(10)}
    sizes = [len(photos[name]) for name in sorted(photos)]
    monkeypatch.setattr(jobs, "STEP_BYTES", 2 * max(sizes))  # two or three photos a step, never four
    reads: list[int] = []
    real_read = jobs._read

    def read(jd, items, pending=None):
        reads.append(sum(it.length for it in items))
        return real_read(jd, items, pending)

    monkeypatch.setattr(jobs, "_read", read)
    job, _, _ = jobs.create_batch_job(make_zip(photos), "q", None, settings, inprocess.store)
    jobs.run_chunk(job, 0, len(photos), inprocess.runtime, inprocess.store, settings)
    st = inprocess.status(job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, len(photos), 0)
    assert len(reads) >= len(photos) // 3 and all(r <= jobs.STEP_BYTES for r in reads)
    assert sum(reads) == sum(sizes)  # each photo read once
    big = [jobs.Item(i, f"{i}", "q", "p", 0, 10) for i in range(5)]
    monkeypatch.setattr(jobs, "STEP_BYTES", 15)
    assert [[it.index for it in step] for step in jobs.steps_of(big, 4)] == [[0], [1], [2], [3], [4]]
    monkeypatch.setattr(jobs, "STEP_BYTES", 1000)
    assert [[it.index for it in step] for step in jobs.steps_of(big, 2)] == [[0, 1], [2, 3], [4]]


def test_steps_in_flight_start_and_end_on_smaller_steps():
    """With steps running side by side, a group's first step is cut into a quarter, a quarter and a
    half, its last into a half, a quarter and a quarter (the decoder starts sooner, less is left once
    it ends); every item still goes once, in order; one step at a time, they are cut as they come."""
    from arrcoc.service.jobs import batch as jobs

    items = [jobs.Item(i, f"{i}", "q", "p", 0, 10) for i in range(30)]
    steps = jobs.steps_of(items, 8, ramp=True)
    assert [len(s) for s in steps] == [2, 2, 4, 8, 8, 4, 1, 1]  # the last step of 6: 4, 1 and 1
    assert [it.index for s in steps for it in s] == list(range(30))
    assert [len(s) for s in jobs.steps_of(items[:8], 8, ramp=True)] == [2, 2, 4]
    assert [len(s) for s in jobs.steps_of(items[:3], 8, ramp=True)] == [3]  # too few to cut
    assert [len(s) for s in jobs.steps_of(items, 8)] == [8, 8, 8, 6]  # one step at a time: as they come


def test_a_jobs_last_quarter_goes_in_smaller_chunks():
    """Chunks of chunk_items, the job's last quarter in chunks a quarter as large (less is left to
    append to results.zip once the last chunks end); every item in exactly one chunk, in order; a
    job of one chunk stays one."""
    from arrcoc.service.jobs import batch as jobs

    def sizes(total: int, size: int) -> list[int]:
        return [b - a for a, b in jobs.chunks_of(total, size)]

    assert sizes(8192, 256) == [256] * 24 + [64] * 32
    assert sizes(1000, 256) == [256] * 2 + [64] * 7 + [40]
    assert sizes(256, 256) == [256] and sizes(3, 256) == [3] and sizes(0, 256) == []
    for total in range(1, 300):
        chunks = jobs.chunks_of(total, 16)
        assert [i for a, b in chunks for i in range(a, b)] == list(range(total)), total
        assert all(0 < b - a <= 16 for a, b in chunks), (total, chunks)


def test_a_first_step_whose_items_all_failed_leaves_results_parquet_whole(inprocess):
    """A step whose items all failed knows neither K nor the grid: results.parquet still has the
    job's schema (the maps' width from the steps that ran), its rows first, one row group a step."""
    from arrcoc.service.jobs import batch as jobs

    step = jobs.step_items(inprocess.runtime)
    files = {f"a{i:02d}.png": b"\x89PNG broken" for i in range(step)} | {
        f"b{i}.png": png_bytes(i) for i in range(2)
    }
    job = inprocess.submit_batch(make_zip(files), "the sky")
    st = wait_finished(inprocess, job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 2, step), st
    with zipfile.ZipFile(inprocess.batch_results(job)) as zf:
        f = pq.ParquetFile(io.BytesIO(zf.read("results.parquet")))
    assert f.num_row_groups == 2 and f.schema_arrow.field("relevance").type.list_size == 32 * 32
    table = f.read()
    assert (
        table["status"].to_pylist() == ["failed"] * step + ["ok"] * 2
        and table["relevance"].null_count == step
    )


def test_turns_keep_turning_after_a_job_yields(settings, tmp_path):
    """Turns held only for the first hand-over: the items a yielded job had not reached counted as
    crash suspects, ran one per step and never yielded again, so a third owner's small job waited
    behind the whole of the big one. Now the big job (A) yields at its next step whenever another
    owner waits, its unreached items are never suspects, and each owner's job starts after at
    most one of A's steps. A's photo is stored in its zip: its first turn reads it from the zip in
    memory, the later ones from the zip written to disk when it yielded."""
    from arrcoc.service.client.inprocess import InProcessExecutor

    n = 100
    ex = InProcessExecutor(
        settings.replace(
            service={"data_dir": tmp_path}, jobs={"slice_s": 0.01}, limits={"max_batch_items": n}
        )
    )
    small = make_zip({"s.png": png_bytes(1)})
    try:
        manifest = "file,query\n" + "a.png,the sky\n" * n
        zipped = make_zip({"a.png": png_bytes(0), "manifest.csv": manifest.encode()}, zipfile.ZIP_STORED)
        a = ex.submit_batch(zipped, owner="a")
        deadline = time.monotonic() + 120
        while ex.status(a, "a").done == 0:
            assert time.monotonic() < deadline, "A never started"
            time.sleep(0.02)
        b = ex.submit_batch(small, "the sky", owner="b")
        assert wait_finished(ex, b).state == JobState.DONE
        c = ex.submit_batch(small, "the sky", owner="c")  # during A's second turn, or later
        assert wait_finished(ex, c).state == JobState.DONE
        left = n - ex.status(a, "a").done
        assert left > 0, "C waited until A had run every item"
        st = wait_finished(ex, a)
        assert (st.done, st.failed) == (n, 0), ex.store.failed_items(a)
        # every item of A was handed to the engine once: none ran as a crash suspect
        assert ex.store.attempts_of(a, list(range(n))) == [1] * n
    finally:
        ex.close()


def test_the_job_thread_ends_quietly_when_closed_during_a_task(monkeypatch):
    """Closing an in-process executor while its job thread ran a job's turn cleared the queues
    under it: the turn's end looked its owner up, and the thread died on a KeyError. It ends
    quietly now, whether the turn yielded or finished."""
    from arrcoc.service.client.inprocess import FairScheduler

    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    for finished in (False, True):
        started, go = threading.Event(), threading.Event()
        jobs = FairScheduler(slice_s=1.0)

        def turn(_yield_now, finished=finished, started=started, go=go) -> bool:
            started.set()
            go.wait(10)
            return finished

        jobs.add("a", turn)
        jobs.add("a", turn)  # a job behind it: the owner's queue is not empty when the turn ends
        assert started.wait(10)
        jobs.shutdown()
        go.set()
        jobs._thread.join(10)
        assert not jobs._thread.is_alive() and errors == []


def test_a_corrupt_stored_entry_fails_its_item_alone(inprocess):
    """A stored entry's CRC is checked when the pipeline reads it: the corrupt photo fails with
    that reason, its neighbours run (the zip was refused whole before, after a serial CRC pass)."""
    files = {f"{i}.png": png_bytes(i) for i in range(4)}
    data = bytearray(make_zip(files, zipfile.ZIP_STORED))
    data[data.find(files["2.png"]) + 100] ^= 0xFF  # one byte of one photo, its headers intact
    job = inprocess.submit_batch(bytes(data), "the sky")
    st = wait_finished(inprocess, job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 3, 1), st
    failed = inprocess.store.failed_items(job)
    assert list(failed) == [2] and "'2.png' is corrupt (its checksum does not match)" in failed[2]


def test_a_job_that_runs_in_one_turn_reads_its_photos_from_memory(inprocess, monkeypatch):
    """In-process a job runs from its zip in memory: one that runs in one turn never writes the zip
    to disk, with steps of a few photos every photo is read whole (one read at a wrong offset or
    cut short would fail its checksum), and once the job is over the zip leaves memory."""
    from arrcoc.service.jobs import archive as archive_mod
    from arrcoc.service.jobs import batch as batch_mod

    monkeypatch.setattr(batch_mod, "STEP_ITEMS", 3)
    monkeypatch.setattr(batch_mod, "MIN_STEP_ITEMS", 3)
    written: list[object] = []
    write = archive_mod._write_archive

    def noted(data, path):
        written.append(path)
        write(data, path)

    monkeypatch.setattr(archive_mod, "_write_archive", noted)
    from_disk: list[int] = []
    read = archive_mod.Item.read

    def read_noted(self, job_dir, opened):
        from_disk.append(self.index)
        return read(self, job_dir, opened)

    monkeypatch.setattr(archive_mod.Item, "read", read_noted)
    held: list[archive_mod.PendingArchive] = []
    init = archive_mod.PendingArchive.__init__

    def init_noted(self, archive, path):
        init(self, archive, path)
        held.append(self)

    monkeypatch.setattr(archive_mod.PendingArchive, "__init__", init_noted)
    files = {f"{i}.png": png_bytes(i) for i in range(10)}
    job = inprocess.submit_batch(make_zip(files, zipfile.ZIP_STORED), "the sky")
    st = wait_finished(inprocess, job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 10, 0), inprocess.store.failed_items(job)
    assert written == [] and from_disk == []
    # once the job is over its zip leaves memory (the job thread lets go of it just after)
    deadline = time.monotonic() + 60
    while held and held[0].data is not None:
        assert time.monotonic() < deadline, "the finished job's zip is still held in memory"
        time.sleep(0.05)
    assert len(held) == 1


def test_a_job_that_waits_its_turn_has_its_zip_on_disk_when_submitted(inprocess):
    """A job queued behind another holds no zip in memory: it is written whole at submission."""
    from arrcoc.service.jobs.archive import ARCHIVE
    from arrcoc.service.jobs.files import job_dir

    running, release = threading.Event(), threading.Event()
    inprocess._jobs.add("someone", lambda _yield_now: (running.set(), release.wait(60), True)[2])
    assert running.wait(30)
    data = make_zip({f"{i}.png": png_bytes(i) for i in range(4)}, zipfile.ZIP_STORED)
    try:
        job = inprocess.submit_batch(data, "the sky", owner="me")
        assert (job_dir(inprocess.settings, job) / ARCHIVE).read_bytes() == data
        assert inprocess.status(job, "me").state == JobState.PENDING
    finally:
        release.set()
    st = wait_finished(inprocess, job)
    assert (st.state, st.done, st.failed) == (JobState.DONE, 4, 0)


def test_a_reservation_is_never_read_half_written(settings, tmp_path):
    """A job's reservation was rewritten in place when the job ended: a budget check reading it
    meanwhile found an empty file and counted the job as holding nothing (and a test reading it
    failed). It is replaced whole now: every read while it is rewritten sees one version or the
    other."""
    from arrcoc.service.jobs.budget import RESERVED, release, reserve

    jd = tmp_path / "jobs" / "j1"
    reserve(settings, jd, "client:a", 1000)
    (jd / "results").mkdir()
    (jd / "results" / "rows").write_bytes(b"x" * 10)
    bad: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            text = (jd / RESERVED).read_text()
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(300):
            release(jd)
    finally:
        stop.set()
        reader.join()
    assert bad == []
    assert json.loads((jd / RESERVED).read_text())["bytes"] == 10
    assert sorted(p.name for p in jd.iterdir()) == [RESERVED, "results"]  # nothing left beside it


def test_a_jobs_disk_share_is_its_payers_whatever_the_session(settings, tmp_path):
    """Two anonymous sessions from one address share one payer's disk share (each new session
    used to get a share of its own); a job that asks for no overlays reserves rows only."""
    from arrcoc.service.client.inprocess import InProcessExecutor
    from arrcoc.service.jobs.budget import payer

    manifest = b"file,query\n" + b"a.png,the sky\n" * 100
    data = make_zip({"a.png": png_bytes(0), "manifest.csv": manifest})
    probe = tmp_path / "probe" / "jobs" / "batch-0123456789abcdef"  # what one such job reserves
    unpack(data, None, probe, settings, "x", pictures=False)
    reserved = json.loads((probe / "reserved.json").read_text())["bytes"]
    assert reserved > 0
    s = settings.replace(
        service={"data_dir": tmp_path / "data"}, limits={"max_owner_bytes": int(reserved * 1.5)}
    )
    ex = InProcessExecutor(s)
    try:
        a = ex.submit_batch(data, owner="session:a", paid_by=payer("session:a", "203.0.113.7"))
        with pytest.raises(InvalidInputError, match="ARRCOC_LIMITS__MAX_OWNER_BYTES"):
            ex.submit_batch(data, owner="session:b", paid_by=payer("session:b", "203.0.113.7"))
        ex.submit_batch(data, owner="session:c", paid_by=payer("session:c", "198.51.100.9"))
        assert wait_finished(ex, a).state == JobState.DONE
    finally:
        ex.close()
