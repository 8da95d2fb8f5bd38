"""Abuse through the demo's API (gradio_client against the app in this process), configured as a
public Space would be: an API token that benchmarks need (ARRCOC_TOKEN_SCOPE=bench), batch jobs
open but bound to whoever made them, rate limits on submissions."""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

import pytest

gradio_client = pytest.importorskip("gradio_client")
from abuse_inputs import MIB, PeakRSS, bomb_zip, du, png_bytes  # noqa: E402
from demo_server import serve  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402
from helpers import make_zip  # noqa: E402

TOKEN = uuid.uuid4().hex
INFER_PER_MIN = 8
ENV = {"ARRCOC_API_TOKEN": TOKEN, "ARRCOC_TOKEN_SCOPE": "bench", "ARRCOC_RATE_LIMIT_INFER_PER_MIN": str(INFER_PER_MIN),
       "ARRCOC_RATE_LIMIT_JOBS_PER_MIN": "20"}  # fmt: skip


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    data = tmp_path_factory.mktemp("abuse-demo")
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        with serve(data) as url:
            yield url, data
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def client(url: str, token: str | None = None) -> Client:
    return Client(url, verbose=False, headers={"X-Arrcoc-Token": token} if token else None)


def wait_done(c: Client, endpoint: str, job_id: str, timeout: float = 180) -> object:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        out = c.predict(job_id, api_name=endpoint)
        doc = out[0]
        finished = ("done", "failed", "cancelled", "expired")
        if (doc.get("state") in finished) if isinstance(doc, dict) else any(f"**{s}**" in doc for s in finished):
            return out
        time.sleep(0.5)
    pytest.fail(f"{job_id} did not finish: {out}")


def test_benchmarks_need_the_token_and_are_bound_to_it(app):
    url, _ = app
    anon, holder, other_holder = client(url), client(url, TOKEN), client(url, TOKEN)
    args = ("arrcoc-texture", ["eager"], ["1"], 2, "cpu")
    with pytest.raises(AppError, match="need the API token"):
        anon.predict(*args, api_name="/bench_submit")
    with pytest.raises(AppError, match="not valid"):
        client(url, "x" * 32).predict(*args, api_name="/bench_submit")
    with pytest.raises(AppError, match="Iterations must"):
        holder.predict("arrcoc-texture", ["eager"], ["1"], 2.5, "cpu", api_name="/bench_submit")
    job_id, *_ = holder.predict(*args, api_name="/bench_submit")
    status, *_ = anon.predict(job_id, api_name="/bench_status")  # without the token: nothing about it
    assert "need the API token" in status and job_id not in status, status
    out = wait_done(other_holder, "/bench_status", job_id)  # the same token, another session: its job
    assert "**done**" in out[0], out[0]


def test_batch_jobs_are_bound_to_their_session_and_polls_leave_no_copies(app):
    url, _ = app
    from demo import jobs

    a, b = client(url), client(url)
    archive = Path(app[1]) / "photos.zip"
    archive.write_bytes(make_zip({f"p{i}.png": png_bytes(64, seed=i) for i in range(3)}))
    job_id, *_ = a.predict(handle_file(str(archive)), None, "the sky", api_name="/batch_submit")
    for endpoint in ("/batch_status", "/batch_cancel"):
        with pytest.raises(AppError, match="No job"):
            b.predict(job_id, api_name=endpoint)
    doc, results = wait_done(a, "/batch_status", job_id)
    assert doc["state"] == "done" and results
    served = jobs.TEMP_ROOT / f"batch-{job_id}"
    gradio_cache = Path(results).parents[1]  # shared with this process's other apps: count this job's files

    def copies() -> list[int]:
        return sorted(p.stat().st_size for p in gradio_cache.rglob(f"*{job_id}*") if p.is_file())

    before = (du(served), copies())
    for _ in range(10):
        a.predict(job_id, api_name="/batch_status")
    assert (du(served), copies()) == before  # no new copy per poll, here or in Gradio's cache
    assert len(list(served.iterdir())) == 1


def test_a_bomb_uploaded_with_a_separate_manifest_is_refused_at_bounded_memory(app, tmp_path):
    url, _ = app
    bomb, manifest = tmp_path / "bomb.zip", tmp_path / "manifest.csv"
    bomb.write_bytes(bomb_zip(1024))
    manifest.write_bytes(b"file,query\nzeros.jpg,the sky\n")
    with PeakRSS() as mem, pytest.raises(AppError, match="zip bomb"):
        client(url).predict(handle_file(str(bomb)), handle_file(str(manifest)), "", api_name="/batch_submit")
    assert mem.growth < 150 * MIB, f"{mem.growth / MIB:.0f} MiB"  # was +4 GB for a 2 GiB entry
    latin = tmp_path / "m.csv"
    latin.write_bytes("file,query\np0.png,café\n".encode("latin-1"))
    photos = tmp_path / "p.zip"
    photos.write_bytes(make_zip({"p0.png": png_bytes(64)}))
    with pytest.raises(AppError, match="not UTF-8"):
        client(url).predict(handle_file(str(photos)), handle_file(str(latin)), "", api_name="/batch_submit")


@pytest.mark.parametrize(
    ("query", "message"),
    [(123, "must be text"), (["the sky"], "must be text"), ("\x1b[2Jthe sky", "control character"),
     ("the\x00sky", "control character")],
)  # fmt: skip
def test_hostile_queries_get_clear_errors(app, query, message, caplog):
    url, _ = app
    with caplog.at_level(logging.INFO, logger="arrcoc.demo"), pytest.raises(AppError, match=message):
        client(url).predict(handle_file(str(Path(__file__).parent.parent / "arrcoc/examples/coffee.jpg")), query,
                            api_name="/infer")  # fmt: skip
    refused = [r for r in caplog.records if r.name == "arrcoc.demo"]
    assert refused and all(r.exc_info is None for r in refused)  # one line each, no traceback


def test_slider_values_of_the_wrong_type_get_clear_errors(app):
    url, _ = app
    photo = handle_file(str(Path(__file__).parent.parent / "arrcoc/examples/coffee.jpg"))
    with pytest.raises(AppError, match="must be a number"):
        client(url).predict(photo, "the cup", "1.0", 1.0, 1.0, 200, 25600, "server default", "sqrt", api_name="/run")
    # K None and a list as the backend gave a generic server error
    with pytest.raises(AppError, match=r"K \(cells kept.*must be a number, got NoneType"):
        client(url).predict(photo, "the cup", 1.0, 1.0, 1.0, None, 25600, "server default", "sqrt", api_name="/run")
    with pytest.raises(AppError, match="backend must be one of its choices \\(text\\), got list"):
        client(url).predict(photo, "the cup", 1.0, 1.0, 1.0, 200, 25600, ["eager"], "sqrt", api_name="/run")


def test_responses_never_name_the_data_store(app):
    url, data = app
    c = client(url)
    archive = Path(data) / "two.zip"
    archive.write_bytes(make_zip({"a.png": png_bytes(64), "b.png": png_bytes(64, seed=1)}))
    job_id, status, *_ = c.predict(handle_file(str(archive)), None, "the sky", api_name="/batch_submit")
    doc, results = wait_done(c, "/batch_status", job_id)
    for text in (str(job_id), str(status), str(doc)):
        assert str(data) not in text and str(Path.home()) not in text


def test_rate_limit_on_interactive_requests(app):
    url, _ = app
    c = client(url)
    messages = []
    for _ in range(INFER_PER_MIN + 2):
        try:
            c.predict(None, "the cup", api_name="/infer")
        except AppError as e:
            messages.append(str(e))
    assert any("Too many requests" in m for m in messages), messages[-3:]
    assert sum("Too many" in m for m in messages) <= 2 + (INFER_PER_MIN + 2) - INFER_PER_MIN


def test_owner_from_cookie_token_or_session():
    from demo import jobs

    class Req:
        def __init__(self, cookies=None, headers=None, session_hash="s1"):
            self.cookies, self.headers, self.session_hash = cookies or {}, headers or {}, session_hash

    browser = Req(cookies={jobs.CLIENT_COOKIE: "ab" * 16})
    assert jobs.owner_of(browser) == "client:" + "ab" * 16  # survives a refresh: the cookie stays
    assert jobs.owner_of(Req(session_hash="s1")) != jobs.owner_of(Req(session_hash="s2"))
    assert jobs.owner_of(Req(cookies={jobs.CLIENT_COOKIE: "<script>"})) == jobs.owner_of(Req())
    assert jobs.client_address(Req(headers={"x-forwarded-for": "6.6.6.6, 10.0.0.7"})) == "10.0.0.7"
