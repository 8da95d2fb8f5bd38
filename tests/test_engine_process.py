"""The engine-process wire (arrcoc/service/host/engine_process.py) without Celery: a real EngineServer
over a CPU Runtime on a Unix socket, and the EngineClient the Celery processes of a group use."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from helpers import assert_same_result, png_bytes, wait_for

from arrcoc.bench.processes import REPO
from arrcoc.errors import DeadlineExceeded, InvalidInputError
from arrcoc.request import Controls
from arrcoc.service.host.engine_process import EngineClient, EngineServer, EngineUnavailableError
from arrcoc.service.host.runtime import Runtime
from arrcoc.settings import default_settings

KEY = b"0123456789abcdef"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    settings = default_settings(
        engine={"device": "cpu", "buckets": (1, 2, 4), "backends": ("eager",)},
        batching={"max_size": 4, "max_delay_ms": 20.0},
    )
    runtime = Runtime(settings)
    runtime.warm()
    address = str(tmp_path_factory.mktemp("engine") / "engine.sock")
    server = EngineServer(runtime, address, KEY)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = EngineClient(settings, address, KEY)
    yield runtime, client, address, settings
    client.close()
    server.close()
    runtime.close()


def test_results_through_the_socket_equal_the_runtimes(served):
    runtime, client, _, _ = served
    from PIL import Image

    image = Image.open(REPO / "arrcoc" / "examples" / "coffee.jpg")
    controls = Controls(k=8, token_budget=1024)
    remote = client.infer(image, "the cup", controls, timeout=60)
    local = runtime.infer(image, "the cup", controls, timeout=60)
    assert_same_result(remote, local)
    assert client.max_batch == 4
    # errors raised in the engine reach the caller as themselves
    with pytest.raises(InvalidInputError, match="eager"):
        client.infer(image, "the cup", controls, timeout=60, backend="onnx")

    batch = client.process(
        [png_bytes(i) for i in range(3)] + [b"not an image"], ["the sky"] * 4, Controls(), "jpeg"
    )
    assert batch.outputs.bucket[:3].tolist() == [4, 4, 4] and batch.outputs.ok.tolist() == [True] * 3 + [
        False
    ]
    assert all(data[:2] == b"\xff\xd8" for data in batch.overlays[:3])  # JPEG overlays, encoded over there
    assert batch.result(3) is None and batch.overlays[3] is None and "image" in batch.errors[3]
    assert_same_result(
        batch.result(0), runtime.process([png_bytes(0)], ["the sky"], Controls(), "none").result(0)
    )
    # the overlay kind crosses the socket: the foveated view, drawn over there as it is here
    remote = client.process([png_bytes(4, 128)], ["the sky"], Controls(), "png", kind="foveated")
    assert (
        remote.overlays
        == runtime.process([png_bytes(4, 128)], ["the sky"], Controls(), "png", kind="foveated").overlays
    )
    assert remote.overlays != runtime.process([png_bytes(4, 128)], ["the sky"], Controls(), "png").overlays


def test_a_chunk_runs_in_the_engine_process_as_in_process(served, tmp_path):
    """A worker group's Celery process runs a chunk over its engine client: it reads the photos,
    the engine process decodes and runs each step, the Celery process writes the rows and records
    the items (Redis): the same rows as the runtime's own run of the same items, a bad item failed
    alone."""
    import io
    import uuid
    import zipfile

    import pyarrow.parquet as pq
    from helpers import BROKER, make_zip

    from arrcoc.service.jobs import batch
    from arrcoc.service.jobs.store import RedisJobStore, redis_client

    runtime, _, address, settings = served
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    s = settings.replace(service={"data_dir": tmp_path, "broker_url": BROKER, "redis_prefix": prefix})
    client = EngineClient(s, address, KEY)  # a Celery process's, with the workers' data dir
    store = RedisJobStore(redis_client(BROKER, 5.0), prefix)
    try:
        files = {f"{i}.png": png_bytes(i) for i in range(3)} | {"bad.png": b"not an image"}
        job, chunks, _ = batch.create_batch_job(
            make_zip(files), "the sky", None, s, store, overlays="relevance"
        )
        out = batch.run_chunk(job, 0, 4, client, store, s)
        assert out["processed"] == 4, out
        st = store.status(job)
        assert (st.state.value, st.done, st.failed) == ("done", 3, 1), st
        with zipfile.ZipFile(tmp_path / "jobs" / job / "results.zip") as zf:
            rows = pq.read_table(io.BytesIO(zf.read("results.parquet"))).to_pylist()
        local = runtime.process([files[r["file"]] for r in rows[:3]], ["the sky"] * 3, Controls(), "none")
        assert [r["status"] for r in rows] == ["ok", "ok", "ok", "failed"] and "image" in rows[3]["error"]
        for i in range(3):  # the same process, device and path: bit-equal
            assert np.array_equal(
                np.asarray(rows[i]["relevance"], np.float32), local.outputs.relevance[i].ravel()
            )
            assert rows[i]["overlay"]
    finally:
        client.close()
        store.r.delete(*(store.r.keys(f"{prefix}:*") or [b"none"]))


def test_a_late_reply_never_reaches_the_next_call(served):
    runtime, client, _, _ = served
    with runtime.exclusive():  # the engine is busy: the reply to the first request comes late
        with pytest.raises(DeadlineExceeded):
            client._routed(("infer", png_bytes(1), "a face", Controls(), 30.0, None), 1, timeout=0.3)
    result = client.infer(png_bytes(2), "the sky", Controls(), timeout=60)
    assert result.query == "the sky"  # not the first request's late answer
    assert np.array_equal(result.relevance, runtime.infer(png_bytes(2), "the sky", Controls(), 60).relevance)


def test_wrong_key_or_no_engine_is_unavailable_not_a_hang(served):
    _, _, address, settings = served
    with pytest.raises(EngineUnavailableError):
        EngineClient(settings, address, b"not-the-key-0000").warm()
    with pytest.raises(EngineUnavailableError):
        EngineClient(settings, address + ".missing", KEY).warm()


def test_concurrent_requests_each_get_their_own_image(served):
    """One connection per client thread: threads must never see each other's replies."""
    runtime, client, _, _ = served
    from concurrent.futures import ThreadPoolExecutor

    images = [png_bytes(seed, size=64 + 8 * seed) for seed in range(6)]
    with ThreadPoolExecutor(6) as pool:
        remote = list(pool.map(lambda im: client.infer(im, "the sky", Controls(), timeout=60), images))
    for image, result in zip(images, remote, strict=True):
        assert_same_result(result, runtime.infer(image, "the sky", Controls(), timeout=60))


def test_connections_go_with_their_threads(served):
    """A Celery process's task threads come and go: each one's connection must be released with
    it, not leak a descriptor apiece."""
    import gc
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    _, client, _, _ = served

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def infer_then_count(i: int) -> int:
        client.infer(png_bytes(i), "the sky", Controls(), timeout=60)
        return fds()

    fds0 = fds()
    with ThreadPoolExecutor(4) as pool:
        assert max(pool.map(infer_then_count, range(8))) > fds0  # the threads' connections were open
    deadline = time.monotonic() + 10
    while fds() > fds0 and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    assert fds() <= fds0


def test_calls_go_to_the_least_loaded_engine_and_around_one_that_is_gone(served):
    """A worker group's Celery process sees every engine: the one with the fewest items in flight
    from it takes a call (the first of the pool among equals), and a call to an engine that does not
    answer goes once to another, the silent one passed over meanwhile."""
    runtime, _, address, settings = served
    pool = EngineClient(settings, [address + ".gone", address], KEY)
    gone, live = pool._routes
    result = pool.infer(png_bytes(4), "the sky", Controls(), timeout=60)
    assert_same_result(result, runtime.infer(png_bytes(4), "the sky", Controls(), timeout=60))
    assert gone.down_until > 0 and gone.in_flight == live.in_flight == 0  # every reservation released
    assert pool._pick(1) is live  # the silent engine is passed over while another answers
    pool._release(live, 1)
    gone.down_until = 0.0  # as if it had come back
    assert pool._pick(1) is gone  # equals: the preferred one
    assert pool._pick(64) is live  # then the one with less in flight
    assert pool._pick(1) is gone
    pool._release(gone, 2)
    pool._release(live, 64)
    pool.close()


def test_an_engine_process_whose_gpu_is_lost_answers_then_exits_to_be_started_again(
    served, tmp_path, monkeypatch
):
    """A CUDA error that sticks to the process's context (a device-side assert) would fail every
    later call: the engine process answers the call that showed it, then exits (its worker group
    starts it again; its callers see EngineUnavailableError and try again). A call whose items all
    ran asks nothing. Stand-in: CI has no GPU whose context can be lost, so the runtime's check
    says so, and os._exit is recorded instead of ending the test run (the process would be gone)."""
    import os

    from arrcoc.service.host import engine_process

    runtime, _, _, settings = served
    asked: list[int] = []
    exits: list[int] = []
    lost = "CUDA error: device-side assert triggered"
    monkeypatch.setattr(runtime, "device_lost", lambda: asked.append(1) or lost)

    monkeypatch.setattr(os, "_exit", exits.append)
    address = str(tmp_path / "lost.sock")
    server = EngineServer(runtime, address, KEY)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = EngineClient(settings, address, KEY)
    try:
        ok = client.process([png_bytes(0)], ["the sky"], Controls(), "none")
        assert ok.errors == [None] and not asked and not exits
        failed = client.process([b"not an image"], ["the sky"], Controls(), "none")
        assert failed.errors[0] and not failed.outputs.ok[0]  # the answer came first
        # the server's thread exits once its answer is sent: on a busy machine, after the caller reads it
        wait_for(lambda: exits, 30, "the engine process exits after answering")
        assert asked and exits == [engine_process.EXIT_DEVICE_LOST]
    finally:
        client.close()
        server.close()


def test_the_groups_wiring_travels_outside_the_users_settings():
    """Where a group's engines are is the supervisor's wiring, in _ARRCOC_ENGINE_* variables: it
    round-trips, and none of it is an ARRCOC_ setting a user could set by mistake."""
    from arrcoc.service.host.wiring import Wiring
    from arrcoc.settings import Settings

    w = Wiring("/tmp/e0.sock", KEY, ("/tmp/e0.sock", "/tmp/e1.sock"), ("/tmp/e1.sock", "/tmp/e0.sock"))
    env = w.to_env()
    assert Wiring.from_env(env) == w and w.in_group and not Wiring.from_env({}).in_group
    assert all(k.startswith("_ARRCOC_ENGINE_") for k in env)
    assert not {"engine_socket", "engine_authkey", "engine_pool", "engine_group"} & set(Settings.model_fields)


def test_messages_cross_whole_and_a_peer_gone_mid_message_is_an_error_not_a_hang():
    """The wire's reader takes multiprocessing's frames: a message of megabytes arrives whole, one
    sent by `send_bytes` too; a peer gone between messages is EOF (the server's thread ends), one
    gone within a message an OSError."""
    import os
    import pickle
    from multiprocessing.connection import Pipe

    from arrcoc.service.host.engine_process import _recv, _send

    a, b = Pipe()
    photos = [os.urandom(n) for n in (1, 70_000, 3_000_000)]
    sender = threading.Thread(target=_send, args=(a, ("process", photos, ["q"] * 3)))
    sender.start()
    assert _recv(b) == ("process", photos, ["q"] * 3)
    sender.join()
    a.send_bytes(pickle.dumps(("ok", 1)))
    assert _recv(b) == ("ok", 1)
    a.close()
    with pytest.raises(EOFError):
        _recv(b)
    b.close()

    a, b = Pipe()
    data = pickle.dumps(("process", photos))
    os.write(a.fileno(), len(data).to_bytes(4, "big") + data[:1000])  # the frame cut short
    a.close()
    with pytest.raises(OSError, match="end of file during message"):
        _recv(b)
    b.close()
