"""The demo's door (demo/gate.py's RateGate) against the real app on a real port: every call counted
by the function Gradio runs for it, whatever the route, index type or body size; uploads counted and
reserved against the disk budget; wrong endpoints and files answered in words; benchmarks closed
without a token; batch zips past the image limit accepted while photos stay bounded by it."""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from pathlib import Path

import httpx
import pytest

gradio_client = pytest.importorskip("gradio_client")
from abuse_inputs import png_bytes  # noqa: E402
from demo_server import serve  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError, ValidationError  # noqa: E402
from helpers import make_zip  # noqa: E402

INFER_PER_MIN = 4
JOBS_PER_MIN = 2
UPLOADS_PER_MIN = INFER_PER_MIN + 2 * JOBS_PER_MIN
IMAGE_LIMIT = 1 << 20  # small, so a zip past it is a few MB
DATA_LIMIT = 40 * 10**6
MB = 10**6
EXAMPLE = Path(__file__).resolve().parent.parent / "arrcoc" / "examples" / "coffee.jpg"
# the test client is the proxy (127.0.0.1): its X-Forwarded-For names the caller, a new one per test
ENV = {
    "ARRCOC_LIMITS__INFER_PER_MIN": str(INFER_PER_MIN),
    "ARRCOC_LIMITS__JOBS_PER_MIN": str(JOBS_PER_MIN),
    "ARRCOC_LIMITS__STATUS_PER_MIN": "1000",
    "ARRCOC_ACCESS__TRUSTED_PROXIES": "127.0.0.1",
    "ARRCOC_LIMITS__MAX_IMAGE_BYTES": str(IMAGE_LIMIT),
    "ARRCOC_LIMITS__MAX_DATA_BYTES": str(DATA_LIMIT),
    "ARRCOC_ACCESS__API_TOKEN": "",
    "ARRCOC_ACCESS__OPEN_BENCHMARKS": "",
}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    data = tmp_path_factory.mktemp("gate")
    old = {k: os.environ.get(k) for k in ENV}
    for k, v in ENV.items():
        if v:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    try:
        with serve(data) as url:
            yield url.rstrip("/"), data
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def fns():
    """The app's functions by api_name (the served app is built the same way: the same indexes)."""
    from demo.app import build_demo

    return {fn.api_name: fn for fn in build_demo().fns.values()}


@pytest.fixture(autouse=True)
def fresh_limits():
    from demo import guard

    guard.reset_limits()


def caller() -> str:
    """A new client address for each test (the proxy's X-Forwarded-For)."""
    return f"198.51.100.{uuid.uuid4().int % 250 + 1}"


def post(url: str, path: str, address: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}{path}", headers={"X-Forwarded-For": address}, timeout=120, **kwargs)


def upload(url: str, address: str, name: str, data: bytes) -> httpx.Response:
    return post(url, "/gradio_api/upload", address, files={"files": (name, data)})


def queue_result(url: str, fn_index: int, data: list, address: str) -> dict:
    """A call through the queue as the page makes it: join, then read the session's stream to the end."""
    session = uuid.uuid4().hex
    joined = post(
        url,
        "/gradio_api/queue/join",
        address,
        json={"data": data, "fn_index": fn_index, "session_hash": session},
    )
    assert joined.status_code == 200, joined.text
    headers = {"X-Forwarded-For": address}
    with httpx.stream(
        "GET", f"{url}/gradio_api/queue/data", params={"session_hash": session}, headers=headers, timeout=120
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                msg = json.loads(line[5:])
                if msg.get("msg") == "process_completed":
                    return msg
    pytest.fail("the queue's stream ended without a result")


# ---- item 1: one gate that sees what Gradio will run --------------------------------------------------


def test_every_function_of_the_app_has_a_limit_class(fns):
    """Every function Gradio can run (a page event too: any is callable by its index) has a class;
    /infer_foveated had none and counted as a status call."""
    from demo.gate import LIMIT_KIND, kind_of

    unclassed = [
        name for name, fn in fns.items() if fn.fn is not None and re.sub(r"_\d+$", "", name) not in LIMIT_KIND
    ]
    assert not unclassed, f"give these a class in demo/gate.py's LIMIT_KIND: {unclassed}"
    assert {kind_of(fns[n]) for n in ("infer", "infer_foveated", "run", "run_without_query")} == {"infer"}
    assert {
        kind_of(fns[n]) for n in ("batch_submit", "bench_submit", "page_batch_submit", "page_bench_submit")
    } == {"jobs"}
    assert not set(LIMIT_KIND) - {re.sub(r"_\d+$", "", n) for n in fns}, "LIMIT_KIND names what the app lacks"


def _ways_to_call(fns: dict, kind: str) -> list[tuple[str, dict]]:
    infer, status = fns["infer"]._id, fns["batch_status"]._id
    call = {"data": [None, "the cup"], "session_hash": uuid.uuid4().hex}
    return {
        "string index": ("/gradio_api/queue/join", call | {"fn_index": str(infer)}),
        "float index": ("/gradio_api/queue/join", call | {"fn_index": float(infer)}),
        "an api_name in the body": (
            "/gradio_api/queue/join",
            call | {"fn_index": infer, "api_name": "/batch_status"},
        ),
        "/run/ naming another endpoint": ("/gradio_api/run/batch_status", call | {"fn_index": infer}),
        "/api/ with an index": (f"/gradio_api/api/x{status}", call | {"fn_index": infer}),
        "/call/ of the foveated view": ("/gradio_api/call/infer_foveated", {"data": [None, "the cup"]}),
        "/call/v2/": ("/gradio_api/call/v2/infer", {"image_path": None, "query": "the cup"}),
    }[kind]


@pytest.mark.parametrize(
    "way",
    [
        "string index",
        "float index",
        "an api_name in the body",
        "/run/ naming another endpoint",
        "/api/ with an index",
        "/call/ of the foveated view",
        "/call/v2/",
    ],
)
def test_a_call_counts_against_the_function_gradio_runs(app, fns, way):
    """The issue's bypasses: `"fn_index": "10"` and `/run/batch_status` with the body naming
    /infer ran inference as status calls (300/min where 60 were allowed); /infer_foveated had no
    class. Each way of calling a model function is now refused past the infer limit."""
    url, _ = app
    address = caller()
    path, body = _ways_to_call(fns, way)
    codes = [post(url, path, address, json=body).status_code for _ in range(INFER_PER_MIN + 2)]
    assert codes.count(429) == 2, (way, codes)
    assert codes[:INFER_PER_MIN].count(429) == 0, codes


def test_the_direct_routes_do_not_run_queued_functions(app, fns):
    """/run/ ran its function outside the queue (no concurrency limit: 36 concurrent 40 MP calls
    +2.4 GB); it is closed for every queued function, so each call waits its turn in the queue."""
    url, _ = app
    address = caller()
    (uploaded,) = upload(url, address, "coffee.jpg", EXAMPLE.read_bytes()).json()
    body = {"data": [{"path": uploaded, "meta": {"_type": "gradio.FileData"}}, "the cup"]}
    for path in ("/gradio_api/run/infer", "/gradio_api/api/infer_foveated"):
        r = post(url, path, address, json=body)
        assert r.status_code == 404 and "join the queue" in r.text, (path, r.status_code, r.text[:200])


def test_a_body_over_the_limit_is_refused_not_waved_through(app, fns):
    """A body over 1 MiB was not parsed and passed as a status call; it is refused unread, with a
    declared length or streamed without one."""
    from arrcoc.tuning import MAX_BODY

    url, _ = app
    address = caller()
    big = {"data": [None, "x" * (MAX_BODY + 10)], "fn_index": fns["infer"]._id, "session_hash": "s"}
    r = post(url, "/gradio_api/queue/join", address, json=big)
    assert r.status_code == 413 and "too large" in r.json()["detail"], r.text[:200]
    raw = json.dumps(big).encode()
    chunks = (raw[i : i + 65536] for i in range(0, len(raw), 65536))  # no Content-Length: chunked
    r = post(url, "/gradio_api/call/infer", address, content=chunks)
    assert r.status_code == 413, r.text[:200]


def test_wrong_endpoints_events_and_files_are_answered_in_words(app, fns):
    """A wrong path answered `{"error": null}` (a file) or 500 Internal Server Error with a
    traceback (an endpoint); a file path the caller made up was read by the handler (a photo on the
    server's disk came back analysed). Each is now a 404 that says what is wrong."""
    url, _ = app
    address = caller()
    r = post(url, "/gradio_api/call/no_such_thing", address, json={"data": []})
    assert r.status_code == 404 and "no endpoint '/no_such_thing'" in r.json()["detail"], r.text
    assert "/infer" in r.json()["detail"]  # it lists what there is
    r = post(url, "/gradio_api/queue/join", address, json={"data": [], "fn_index": 999, "session_hash": "s"})
    assert r.status_code == 404 and "fn_index 999" in r.json()["detail"], r.text
    r = httpx.get(f"{url}/gradio_api/call/infer/{uuid.uuid4().hex}", timeout=30)
    assert r.status_code == 404 and "No such call" in r.json()["detail"], r.text
    for file in ({"path": str(EXAMPLE), "meta": {"_type": "gradio.FileData"}}, {"path": str(EXAMPLE)}):
        r = post(url, "/gradio_api/call/infer", address, json={"data": [file, "the cup"]})
        assert r.status_code == 404, r.text
        assert "is not on this server: upload it first" in r.json()["detail"], r.text
    c = Client(url, verbose=False, headers={"X-Forwarded-For": address})
    doc, _ = c.predict(handle_file(str(EXAMPLE)), "the cup", api_name="/infer")  # an uploaded one runs
    assert doc["query"] == "the cup"


# ---- item 9: benchmarks closed by default -------------------------------------------------------------


def test_benchmarks_are_closed_to_anonymous_callers_without_a_token(app, fns):
    """With no token set (as ./scripts/demo.sh and app.py start), three anonymous benchmarks held
    the engine for minutes; now every route refuses them, and ARRCOC_ACCESS__OPEN_BENCHMARKS opens them."""
    url, _ = app
    address = caller()
    args = ["arrcoc-texture", ["eager"], ["1"], 2, "cpu"]
    with pytest.raises(AppError, match="Benchmarks are closed on this server"):
        Client(url, verbose=False, headers={"X-Forwarded-For": address}).predict(
            *args, api_name="/bench_submit"
        )
    # the page's own event, and the REST route (each from its own address: two submissions a minute)
    out = queue_result(url, fns["page_bench_submit"]._id, [*args, ""], caller())
    assert not out["success"] and "Benchmarks are closed" in out["output"]["error"], out
    r = post(url, "/gradio_api/call/bench_submit", caller(), json={"data": args})
    text = httpx.get(f"{url}/gradio_api/call/bench_submit/{r.json()['event_id']}", timeout=60).text
    assert "Benchmarks are closed" in text, text

    from arrcoc.service.access import check_token
    from arrcoc.settings import default_settings

    assert check_token(default_settings(access={"open_benchmarks": True}), "bench", None) is None


# ---- item 4: uploads counted and reserved -------------------------------------------------------------


def test_uploads_are_rate_limited(app):
    """40 x 20 MB uploads in 6 s were neither counted nor limited: an upload now counts (a photo a
    request, a zip and a manifest a job)."""
    url, _ = app
    address = caller()
    codes = [
        upload(url, address, f"p{i}.png", png_bytes(32, seed=i)).status_code
        for i in range(UPLOADS_PER_MIN + 2)
    ]
    assert codes.count(429) == 2 and codes[:UPLOADS_PER_MIN].count(200) == UPLOADS_PER_MIN, codes


def _reserved() -> int:
    from arrcoc.service.jobs import budget
    from arrcoc.settings import get_settings

    return budget.usage(Path(get_settings().service.data_dir) / "jobs", "")[0]


def _uploads(data: Path) -> dict[str, list[str]]:
    root = data / "jobs"
    return {
        f.name: json.loads((f / "files.json").read_text())
        for f in root.glob("upload-*")
        if (f / "files.json").exists()
    }


def _age(data: Path, name: str, seconds: float) -> None:
    reserved = data / "jobs" / name / "reserved.json"
    t = time.time() - seconds
    os.utime(reserved, (t, t))


def test_uploads_count_against_the_disk_budget_and_go_sooner_when_it_is_tight(app):
    """Uploads filled the disk a running job needed (236 of 300 items lost): each is now reserved at
    its length before a byte is written, refused when the budget is spoken for, and, while half
    of it is, swept after minutes instead of an hour."""
    from demo import housekeeping

    url, data = app
    for name in _uploads(data):  # what earlier tests uploaded: gone, so the figures below are this test's
        _age(data, name, 7200)
    housekeeping.sweep_uploads()
    base = _reserved()
    assert 2 * (base + MB) < DATA_LIMIT, base

    small = upload(url, caller(), "small.bin", os.urandom(MB))
    assert small.status_code == 200, small.text
    (old,) = [n for n, paths in _uploads(data).items() if paths == small.json()]
    _age(data, old, 2 * housekeeping.TIGHT_UPLOAD_AGE_S)
    housekeeping.sweep_uploads()
    assert old in _uploads(data)  # room to spare: an upload stays for the usual hour

    size = DATA_LIMIT // 2 - base + MB  # tight with or without the small one
    big = upload(url, caller(), "big.bin", os.urandom(size))
    assert big.status_code == 200, big.text
    assert _reserved() >= DATA_LIMIT // 2
    housekeeping.sweep_uploads()  # tight: the old small one goes, files and reservation
    assert old not in _uploads(data) and not Path(small.json()[0]).exists()
    assert Path(big.json()[0]).exists()

    refused = upload(url, caller(), "more.bin", os.urandom(DATA_LIMIT - _reserved() + MB))
    assert refused.status_code == 507, refused.text
    assert "ARRCOC_LIMITS__MAX_DATA_BYTES" in refused.json()["detail"], refused.text

    (big_name,) = [n for n, paths in _uploads(data).items() if paths == big.json()]
    _age(data, big_name, 2 * housekeeping.TIGHT_UPLOAD_AGE_S)
    housekeeping.sweep_uploads()
    assert not Path(big.json()[0]).exists() and _reserved() < DATA_LIMIT // 2
    again = upload(url, caller(), "more.bin", os.urandom(DATA_LIMIT // 2))
    assert again.status_code == 200, again.text


# ---- issue 46 item 3: zips past the image limit, photos held to it ----------------------------------


def test_a_batch_zip_over_the_image_limit_is_accepted_and_photos_stay_bounded(app, tmp_path):
    """launch(max_file_size=max_image_bytes) refused every zip over the image limit (a 31.6 MB zip
    of 600 photos, 413); zips now go up to ARRCOC_LIMITS__MAX_ARCHIVE_BYTES while a photo sent to /infer
    over the image limit is refused in words before Gradio decodes it."""
    url, _ = app
    address = caller()
    c = Client(url, verbose=False, headers={"X-Forwarded-For": address})
    photos = {f"p{i:02d}.png": png_bytes(300, seed=i) for i in range(12)}
    archive = tmp_path / "photos.zip"
    archive.write_bytes(make_zip(photos))
    assert archive.stat().st_size > 2 * IMAGE_LIMIT
    status = c.predict(handle_file(str(archive)), None, "the sky", "none", api_name="/batch_submit")
    deadline = time.monotonic() + 300
    while not status["finished"] and time.monotonic() < deadline:
        time.sleep(1.0)
        status, _ = c.predict(status["job_id"], api_name="/batch_status")
    assert status["state"] == "done", status

    big = tmp_path / "big.png"
    big.write_bytes(png_bytes(640, seed=99))
    assert big.stat().st_size > IMAGE_LIMIT
    with pytest.raises(
        ValidationError,
        match=r"image_path: The image is 1\.\d MB; the limit is 1 MB \(ARRCOC_LIMITS__MAX_IMAGE_BYTES\)",
    ):
        c.predict(handle_file(str(big)), "the cup", api_name="/infer")


CHROMIUM = Path("/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")
def test_the_page_says_why_a_large_photo_and_a_benchmark_are_refused(app, tmp_path):
    """In a real browser: a photo over the image limit is taken by the upload (zips that large must
    be) and refused when Run is pressed, in words beside the photo; the Benchmark tab's Run says
    benchmarks are closed and how an operator opens them."""
    sync_api = pytest.importorskip("playwright.sync_api")
    url, _ = app
    big = tmp_path / "big.png"
    big.write_bytes(png_bytes(640, seed=7))
    SHOTS.mkdir(parents=True, exist_ok=True)
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=flags)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.set_default_timeout(60_000)
        page.goto(url)
        page.wait_for_selector("#run")
        page.locator("#photo input[type=file]").set_input_files(str(big))
        page.wait_for_selector("#photo img")  # uploaded: no "exceeds the maximum file size"
        page.locator("#query textarea").fill("the red one")
        page.locator("#run").click()
        page.get_by_text(re.compile(r"The image is 1\.\d MB; the limit is 1 MB")).first.wait_for(
            state="visible"
        )
        page.screenshot(path=str(SHOTS / "gate-photo-over-the-image-limit.png"))

        page.locator("#main-tabs button[role=tab]:visible").filter(
            has_text=re.compile("^Benchmark$")
        ).first.click()
        page.locator("#bench-submit").click()
        toast = page.locator(".toast-body, [data-testid='toast-body']").filter(
            has_text="Benchmarks are closed"
        )
        toast.first.wait_for(state="visible")
        assert "ARRCOC_ACCESS__OPEN_BENCHMARKS" in toast.first.inner_text()
        page.wait_for_timeout(600)  # the toast's entrance
        page.screenshot(path=str(SHOTS / "gate-benchmarks-closed.png"))
        browser.close()
