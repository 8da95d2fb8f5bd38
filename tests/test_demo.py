"""The demo's API, driven by gradio_client against the app launched in this process."""

from __future__ import annotations

import csv
import io
import json
import time
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

gradio_client = pytest.importorskip("gradio_client")
from demo_server import serve  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

POLL_S = 0.5


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Client:
    # this module submits more jobs in a minute than one client may (the limit has its own tests:
    # tests/test_abuse_demo.py)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ARRCOC_LIMITS__JOBS_PER_MIN", "60")
        mp.setenv("ARRCOC_ACCESS__OPEN_BENCHMARKS", "1")  # this module runs benchmarks without a token
        with serve(tmp_path_factory.mktemp("demo-data")) as url:
            yield Client(url, verbose=False)


def wait_for(client: Client, endpoint: str, job_id: str, timeout: float = 120.0) -> tuple:
    """Poll a status endpoint (JSON and files) until the job finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = client.predict(job_id, api_name=endpoint)
        if out[0]["finished"]:
            return out
        time.sleep(POLL_S)
    pytest.fail(f"{endpoint} {job_id} did not finish in {timeout} s: {out[0]}")


def test_named_endpoints(client):
    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    public = {
        "/infer",
        "/infer_foveated",
        "/run",
        "/batch_submit",
        "/batch_status",
        "/batch_cancel",
        "/bench_submit",
        "/bench_status",
    }
    assert public <= set(api)
    for name in public:  # written for users, not a handler's docstring
        text = api[name].get("description") or ""
        assert text and "store the run" not in text and "handler" not in text, (name, text)


def test_query_over_the_limit_is_refused_not_cut(client, examples_dir):
    from arrcoc.settings import get_settings

    limit = get_settings().limits.max_query_chars
    with pytest.raises(AppError, match=f"{limit + 20} characters; the limit is {limit}"):
        client.predict(handle_file(str(examples_dir / "coffee.jpg")), "x" * (limit + 20), api_name="/infer")


def test_infer_matches_cli_json(client, examples_dir, tmp_path):
    from arrcoc.cli import main

    photo = examples_dir / "coffee.jpg"
    doc, overlay_path = client.predict(handle_file(str(photo)), "the coffee cup", api_name="/infer")
    cli_out = tmp_path / "cli.json"
    assert (
        main(["infer", str(photo), "--query", "the coffee cup", "--json", str(cli_out), "--device", "cpu"])
        == 0
    )
    cli = json.loads(cli_out.read_text())
    assert list(doc) == list(cli)  # same keys, same order
    assert doc["query"] == "the coffee cup" and doc["grid"] == cli["grid"]
    assert np.array(doc["relevance"]).shape == np.array(cli["relevance"]).shape == (doc["grid"], doc["grid"])
    if cli["weights_version"] != "untrained":  # untrained models are randomly initialised per process
        np.testing.assert_allclose(np.array(doc["relevance"]), np.array(cli["relevance"]), atol=1e-4)
    assert len(doc["selected"]) == len(doc["budgets"]) == cli["k"]
    from PIL import Image

    with Image.open(overlay_path) as im:
        assert im.size == tuple(cli["image_size"])


def test_infer_foveated_gives_the_photo_sharp_only_in_the_selected_boxes(client, examples_dir):
    """/infer_foveated: /infer's JSON and the picture a VLM would be given, at the photo's size: the
    photo's own pixels inside the selected boxes (each affords them at the default budgets), blurred
    elsewhere. /infer keeps its overlay."""
    from PIL import Image

    from arrcoc.images import load_image

    photo = examples_dir / "coffee.jpg"
    doc, view_path = client.predict(handle_file(str(photo)), "the red one", api_name="/infer_foveated")
    plain, _ = client.predict(handle_file(str(photo)), "the red one", api_name="/infer")
    assert list(doc) == list(plain) and doc["selected"] == plain["selected"]
    original = np.asarray(load_image(photo.read_bytes()), dtype=np.float64)
    with Image.open(view_path) as im:
        assert im.size == tuple(doc["image_size"])
        view = np.asarray(im.convert("RGB"), dtype=np.float64)
    inside = np.zeros(original.shape[:2], dtype=bool)
    assert len(doc["selected_boxes"]) == doc["k"]
    for x0, y0, x1, y1, tokens in doc["selected_boxes"]:
        assert tokens >= 64
        inside[y0:y1, x0:x1] = True
    err = np.abs(original - view).mean(axis=2)
    assert err[inside].max() == 0, "selected cells: the photo's own pixels"
    assert err[~inside].mean() > 3, "the rest: reduced to a low base resolution"


@pytest.mark.parametrize(
    ("payload", "query", "message"),
    [
        (b"definitely not an image", "the cup", "not an image format we can read"),
        (None, "   ", "query is empty"),
        ("no file", "the cup", "Upload a photo first"),
    ],
)
def test_infer_bad_input_says_why(client, examples_dir, tmp_path, payload, query, message):
    path = examples_dir / "coffee.jpg"
    if isinstance(payload, bytes):
        path = tmp_path / "broken.jpg"
        path.write_bytes(payload)
    with pytest.raises(AppError, match=message):
        client.predict(None if payload == "no file" else handle_file(str(path)), query, api_name="/infer")


def test_unknown_job_ids_are_explained(client):
    with pytest.raises(AppError, match="batch-doesnotexist"):
        client.predict("batch-doesnotexist", api_name="/batch_status")
    with pytest.raises(AppError):
        client.predict("batch-doesnotexist", api_name="/batch_cancel")


def test_batch_job_end_to_end(client, examples_dir, tmp_path):
    photos = sorted(examples_dir.glob("*.jpg"))
    archive = tmp_path / "photos.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for p in photos:
            zf.write(p, p.name)
    job_id = client.predict(handle_file(str(archive)), None, "the face", api_name="/batch_submit")["job_id"]
    status, results = wait_for(client, "/batch_status", job_id)  # clean JSON, and the zip
    assert status["state"] == "done" and status["done"] == status["total"] == len(photos)
    assert status["results"]["rows"] == "results.parquet" and "items" not in status  # counts, not rows
    from demo.batchview import item_rows

    items = item_rows(results)
    assert sorted(i["file"] for i in items) == sorted(p.name for p in photos)
    for i in items:
        assert i["ok"] and 0 <= i["match_score"] <= 1 and isinstance(i["weak_match"], bool)
        assert set(i["top_cell"]) == {"row", "col"} and 0 <= i["top_cell"]["row"] < 32
    with zipfile.ZipFile(io.BytesIO(Path(results).read_bytes())) as zf:
        rows = pq.read_table(io.BytesIO(zf.read("results.parquet")))
        summary = list(csv.DictReader(io.StringIO(zf.read("summary.csv").decode())))
    assert {"match_score", "weak_match", "top_row", "top_col"} <= set(
        summary[0]
    ) and "top_cell" not in summary[0]
    assert all(0 <= int(r["top_row"]) < 32 and 0 <= int(r["top_col"]) < 32 for r in summary)
    assert rows.num_rows == len(photos)
    assert set(rows["query"].to_pylist()) == {"the face"}


def test_a_job_asked_for_by_another_client_says_who_may_read_it(client, examples_dir, tmp_path):
    """A new Client() got "No job ...: check the id (jobs are kept for a limited time)", which reads
    as expired: the answer says that a job is shown only to whoever submitted it. What the README
    and the endpoint's description say /batch_status holds is what it holds."""
    archive = tmp_path / "one.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(examples_dir / "coffee.jpg", "coffee.jpg")
    job_id = client.predict(handle_file(str(archive)), None, "the red one", api_name="/batch_submit")[
        "job_id"
    ]
    status, _ = wait_for(client, "/batch_status", job_id)
    other = Client(client.src, verbose=False)
    with pytest.raises(AppError) as refused:
        other.predict(job_id, api_name="/batch_status")
    said = str(refused.value)
    assert job_id in said and "whoever submitted it" in said and "gradio_client Client" in said, said
    with pytest.raises(AppError, match="whoever submitted it"):  # an id never issued: the same words
        client.predict("batch-0123456789abcdef", api_name="/batch_status")
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert set(status["results"]) == {"file", "rows", "summary", "overlays"}
    assert all(f"`{key}`" in readme for key in status["results"]) and "one entry per item" not in readme
    description = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/batch_status"]
    assert "one entry per item" not in description["description"]
    assert "submitted the job" in description["description"]


def test_batch_submit_takes_an_optional_overlays_choice(client, examples_dir, tmp_path):
    """/batch_submit's fourth input: "foveated" overlays (the photo, not the map: no heatmap colours
    over it), "relevance" (the map over the photo), and without it none (results.parquet and
    summary.csv only; the status says so); a bad choice is refused in words naming the choices."""
    archive = tmp_path / "one.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(examples_dir / "coffee.jpg", "coffee.jpg")
    with pytest.raises(AppError, match="none.*relevance.*foveated"):
        client.predict(handle_file(str(archive)), None, "the cup", "heatmap", api_name="/batch_submit")
    pictures = {}
    for kind in ("foveated", "relevance", None):
        args = (handle_file(str(archive)), None, "the cup") + ((kind,) if kind else ())
        job_id = client.predict(*args, api_name="/batch_submit")["job_id"]
        status, results = wait_for(client, "/batch_status", job_id)
        assert status["state"] == "done", status
        with zipfile.ZipFile(results) as zf:
            drawn = [n for n in zf.namelist() if n.startswith("overlays/")]
            if kind is None:
                assert drawn == [] and status["results"]["overlays"] is None, (drawn, status)
                assert {"results.parquet", "summary.csv"} <= set(zf.namelist())
                continue
            assert status["results"]["overlays"] == "overlays/"
            (name,) = drawn
            pictures[kind] = np.asarray(Image.open(io.BytesIO(zf.read(name))).convert("RGB"), dtype=float)
    photo = np.asarray(Image.open(examples_dir / "coffee.jpg").convert("RGB"), dtype=float)
    # JPEG overlays: the foveated view stays near the photo, the heatmap blend does not
    assert np.abs(pictures["foveated"] - photo).mean() < 0.5 * np.abs(pictures["relevance"] - photo).mean()


def test_batch_refuses_a_non_zip(client, tmp_path):
    bogus = tmp_path / "photos.zip"
    bogus.write_bytes(b"PK? not really")
    with pytest.raises(AppError, match="not a readable .zip"):
        client.predict(handle_file(str(bogus)), None, "the face", api_name="/batch_submit")


def _plain_json(value: object) -> None:
    """Data a program can use: JSON types only, no widget updates ({'__type__': ...}), no page HTML."""
    text = json.dumps(value)
    assert "__type__" not in text and "<div" not in text and "<span" not in text, text[:300]


def test_job_endpoints_answer_plain_json(client, examples_dir, tmp_path):
    """/batch_submit, /batch_status, /batch_cancel, /bench_submit, /bench_status: job id, state and
    counts as JSON (the page keeps its own widgets on private events)."""
    archive = tmp_path / "one.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.write(examples_dir / "coffee.jpg", "coffee.jpg")
    doc = client.predict(handle_file(str(archive)), None, "the red one", api_name="/batch_submit")
    _plain_json(doc)
    assert doc["job_id"] and doc["kind"] == "batch" and doc["state"] in ("pending", "running", "done")
    assert {"total", "done", "failed", "progress", "finished"} <= set(doc)
    status, _ = client.predict(doc["job_id"], api_name="/batch_status")
    _plain_json(status)
    assert status["job_id"] == doc["job_id"]
    cancelled = client.predict(doc["job_id"], api_name="/batch_cancel")
    _plain_json(cancelled)
    assert cancelled["job_id"] == doc["job_id"] and cancelled["state"] in ("cancelled", "done")
    bench = client.predict("arrcoc-texture", ["eager"], ["1"], 2, "cpu", api_name="/bench_submit")
    _plain_json(bench)
    assert bench["job_id"] and bench["kind"] == "bench"
    out, _ = client.predict(bench["job_id"], api_name="/bench_status")
    _plain_json(out)
    assert out["job_id"] == bench["job_id"] and isinstance(out["finished"], bool)
    wait_for(client, "/bench_status", bench["job_id"], timeout=180)


def test_tiny_cpu_benchmark(client):
    job_id = client.predict("arrcoc-texture", ["eager"], ["1"], 3, "cpu", api_name="/bench_submit")["job_id"]
    doc, files = wait_for(client, "/bench_status", job_id, timeout=180)
    assert doc["state"] == "done", doc
    rows = doc["results"]
    assert [(r["backend"], int(r["bucket"])) for r in rows] == [("eager", 1)]
    assert float(rows[0]["p50_ms"]) > 0
    assert sorted(Path(f).suffix for f in files) == [".csv", ".json"]


def test_uploads_over_the_size_limit_are_refused(client, tmp_path):
    from arrcoc.settings import get_settings

    big = tmp_path / "huge.png"
    big.write_bytes(b"\x89PNG" + bytes(get_settings().limits.max_image_bytes + 1024))
    # refused at the door (413) or by the image check, in words that give the limit
    with pytest.raises(Exception, match="(?i)exceeds|too large|413|maximum|the limit is"):
        client.predict(handle_file(str(big)), "the cup", api_name="/infer")


def test_a_48_megapixel_phone_photo_is_accepted(client, tmp_path):
    """Over the pixel limit as declared, but a JPEG: reduced while decoding, not refused."""
    from PIL import Image

    from arrcoc.settings import get_settings

    rng = np.random.default_rng(0)
    small = Image.fromarray((rng.random((60, 80, 3)) * 255).astype(np.uint8))
    photo = tmp_path / "phone.jpg"
    small.resize((8000, 6000), Image.Resampling.BILINEAR).save(photo, quality=80)
    assert 8000 * 6000 > get_settings().limits.max_image_pixels
    doc, overlay_path = client.predict(handle_file(str(photo)), "the red one", api_name="/infer")
    assert doc["image_size"] == [8000, 6000] and 0 <= doc["match_score"] <= 1
    with Image.open(overlay_path) as im:
        assert max(im.size) <= 4000  # drawn from the reduced decode
