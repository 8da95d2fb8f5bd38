"""The demo in a real browser: Playwright driving Debian's chromium (never `playwright install`).

Uploads a real photo, types a query, runs it, sees the heatmap and the match score inside the
window (1440x900), changes the query and sees the map change, switches views, checks that every
chart draws coloured marks, clicks an example and sees it run, sees a score above the weak line
shown as a possible match with its caveat beside it, runs a small batch job and sees its gallery,
downloads its zip, finds the job again from the URL after a reload (and not from another
browser, which is told why), runs one without overlays and sees its relevance maps, and reads the
benchmark reports' charts: a stored one says where and when it was measured, this machine's comes
first.
Screenshots of every view go to artifacts/screenshots/ (git-ignored): look at them. Prints the
median time from clicking Run to the heatmap appearing.
"""

from __future__ import annotations

import io
import re
import statistics
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

sync_api = pytest.importorskip("playwright.sync_api")
from demo_server import serve  # noqa: E402
from helpers import result_rows  # noqa: E402
from PIL import Image  # noqa: E402

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"
QUERIES = ["the red one", "the top right", "the silver one", "the white saucer", "the left side", "a giraffe"]
VIEWS = {  # tab label -> what must be on screen in it
    "Homunculus": "img",
    "Three ways": "img",
    "Overlays": "img",
    "Texture": "img",
    "LOD budget": "#budget-chart svg.main-svg",
    "vs uniform": "img",
    "foveated": "#foveated img",
    "Metrics": "text=spatial entropy",
    "Query impact": "img",
    "Attribution": "#attribution-chart svg.main-svg",
}
VIEWPORT = {"width": 1440, "height": 900}
# plotly draws bars as paths in .barlayer, lines as path.js-line and markers as path.point in .scatterlayer
MARKS_JS = """(sel) => [...document.querySelectorAll(sel + ' .barlayer path, ' + sel + ' .scatterlayer path.js-line, '
  + sel + ' .scatterlayer path.point')]
  .map(p => { const s = getComputedStyle(p); return {fill: s.fill, stroke: s.stroke, w: p.getBoundingClientRect().width,
  h: p.getBoundingClientRect().height}; })"""

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)"
)


@pytest.fixture(scope="module")
def local_reports(tmp_path_factory) -> Path:
    """This machine's benchmark reports (what `arrcoc bench` wrote here): none until a test adds one."""
    return tmp_path_factory.mktemp("bench-out")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, local_reports):
    from demo import reports

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(reports, "LOCAL_DIR", local_reports)
        mp.setenv("ARRCOC_ACCESS__OPEN_BENCHMARKS", "1")  # the Benchmark tab's job runs without a token
        with serve(tmp_path_factory.mktemp("browser-data")) as url:
            yield url


@pytest.fixture(scope="module")
def page(app_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
        pg = context.new_page()
        pg.set_default_timeout(45_000)
        pg.goto(app_url)
        pg.wait_for_selector("#run")
        yield pg
        browser.close()


def shot(page, name: str, selector: str | None = None, full: bool = True) -> Path:
    path = SHOTS / f"{name}.png"
    (page.locator(selector) if selector else page).screenshot(
        path=str(path), **({} if selector else {"full_page": full})
    )
    return path


def heatmap_pixels(page) -> np.ndarray:
    src = page.locator("#relevance-map img").get_attribute("src")
    body = page.request.get(src).body()
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"), dtype=np.int16)


def run_query(page, query: str, timeout_ms: float = 45_000) -> float:
    """Type the query, click Run, wait until the heatmap for it is shown; seconds taken."""
    page.locator("#query textarea").fill(query)
    t0 = time.perf_counter()
    page.locator("#run").click()
    page.wait_for_function(
        "(q) => { const s = document.querySelector('#summary'); const i = document.querySelector('#relevance-map img');"
        " return i && i.complete && i.naturalWidth > 0 && s && s.innerText.includes(q); }",
        arg=query,
        timeout=timeout_ms,
    )
    took = time.perf_counter() - t0
    # the other views and the query-impact run follow in the same click; let them finish
    page.wait_for_function(
        "(q) => (document.querySelector('#views-status')?.innerText || '').includes(q)", arg=query
    )
    return took


def in_viewport(page, selector: str) -> bool:
    """Is the element's top edge inside the window as it is now (after any scrolling)?"""
    box = page.locator(selector).first.bounding_box()
    return box is not None and 0 <= box["y"] < VIEWPORT["height"] - 40 and box["height"] > 0


def coloured_marks(page, selector: str) -> list[dict]:
    """The chart's drawn marks that a person can see: filled or stroked with a colour, not `none`."""
    page.locator(f"{selector} svg.main-svg").first.wait_for(state="visible")
    seen: list[dict] = []
    for _ in range(40):  # plotly draws its traces a moment after the svg appears
        marks = page.evaluate(MARKS_JS, selector)
        seen = [
            m
            for m in marks
            if (m["fill"] not in ("none", "") and m["h"] > 0)
            or (m["stroke"] not in ("none", "") and m["w"] > 0)
        ]
        if seen:
            break
        page.wait_for_timeout(250)
    return seen


def settle_images(page, scope: str) -> None:
    """Scroll every image of the scope into view and wait until each has loaded (galleries load lazily)."""
    imgs = page.locator(f"{scope} img:visible")
    for i in range(imgs.count()):
        imgs.nth(i).scroll_into_view_if_needed()
    page.wait_for_function(
        "(s) => [...document.querySelectorAll(s + ' img')].filter(i => i.offsetParent)"
        ".every(i => i.complete && i.naturalWidth > 0)",
        arg=scope,
    )
    page.locator(f"{scope}:visible").first.scroll_into_view_if_needed()


def close_toasts(page) -> None:
    for button in page.locator(".toast-close, [data-testid='toast-close']").all():
        if button.is_visible():
            button.click()


def open_tab(page, scope: str, label: str) -> None:
    """Click the visible tab button with this label (the page is wide enough that none overflow)."""
    tab = (
        page.locator(f"{scope} button[role=tab]:visible")
        .filter(has_text=re.compile(f"^{re.escape(label)}$"))
        .first
    )
    tab.click()
    page.wait_for_function(
        "([scope, label]) => [...document.querySelectorAll(scope + ' button[role=tab]')]"
        ".some(b => b.innerText.trim() === label && b.getAttribute('aria-selected') === 'true')",
        arg=[scope, label],
    )


def test_inference_views_and_timing(page, examples_dir, monkeypatch):
    page.locator("#photo input[type=file]").set_input_files(str(examples_dir / "coffee.jpg"))
    page.wait_for_selector("#photo img")
    shot(page, "00-page-before-run")
    assert page.get_by_text("Use via API").first.is_visible(), "the 'Use via API' link is hidden"
    cold = run_query(page, QUERIES[0], timeout_ms=180_000)  # builds the executor and loads the model
    first = heatmap_pixels(page)
    shot(page, "01-inference-overview", full=False)  # what the window shows right after Run
    assert first.std() > 5, "the heatmap is blank"
    assert in_viewport(page, "#relevance-map img") and in_viewport(page, "#match"), (
        "results are out of view after Run"
    )
    match = page.locator("#match")
    assert match.is_visible() and re.search(r"[Mm]atch score: \d\.\d\d", match.inner_text()), (
        match.inner_text()
    )

    warm = [run_query(page, q) for q in QUERIES[1:]]
    second = heatmap_pixels(page)
    print(
        f"\nclick Run -> heatmap shown: first run (loads the model) {cold:.2f} s; "
        f"median of {len(warm)} later runs {statistics.median(warm):.2f} s (min {min(warm):.2f}, max {max(warm):.2f})"
    )
    assert first.shape == second.shape
    assert np.abs(first - second).mean() > 0.05, "changing the query did not change the map"
    assert QUERIES[-1] in page.locator("#summary").inner_text()
    assert "Weak match" in page.locator("#match").inner_text(), (
        "a giraffe on the coffee photo is not called weak"
    )
    shot(page, "01-inference-weak-match", full=False)

    from demo import service

    model_calls: list[str] = []
    real_infer = service.infer
    monkeypatch.setattr(service, "infer", lambda *a, **k: model_calls.append(a[1]) or real_infer(*a, **k))
    for label, what in VIEWS.items():
        open_tab(page, "#views", label)
        panel = page.locator("#views [role=tabpanel]:visible").first
        panel.locator(what).first.wait_for(state="visible")
        assert (
            page.locator("#match-views").is_visible()
            and "match" in page.locator("#match-views").inner_text().lower()
        )
        if what.endswith("svg.main-svg"):
            chart = what.split()[0]
            assert coloured_marks(page, chart), f"the {label} chart draws no coloured marks"
        settle_images(page, "#views [role=tabpanel]")
        shot(page, f"02-view-{label.lower().replace(' ', '-')}", "#views-section")

    # switching views, overlay map or opacity redraws from the stored run: no model call
    open_tab(page, "#views", "Overlays")
    before = page.locator("#overlay img").get_attribute("src")
    page.locator("#views [role=tabpanel]:visible").first.get_by_text("participatory", exact=True).click()
    page.wait_for_function(
        "(s) => document.querySelector('#overlay img')?.getAttribute('src') !== s", arg=before
    )
    before = page.locator("#overlay img").get_attribute("src")
    page.locator("#views [role=tabpanel]:visible input[type=number]").first.fill("0.9")
    page.locator("#views [role=tabpanel]:visible input[type=number]").first.press("Enter")
    page.wait_for_function(
        "(s) => document.querySelector('#overlay img')?.getAttribute('src') !== s", arg=before
    )
    shot(page, "02-view-overlay-participatory", "#views-section")
    before = page.locator("#relevance-map img").get_attribute("src")
    page.locator("#scale").get_by_text("rank", exact=True).click()  # another colour scale: redrawn
    page.wait_for_function(
        "(s) => document.querySelector('#relevance-map img')?.getAttribute('src') !== s", arg=before
    )
    assert model_calls == [], "a view change ran the model again"
    shot(page, "02-view-overview-rank-scale", "#results")


def test_examples_and_model_note(page):
    page.locator("#model-note").get_by_text("About the model").first.click()
    note = page.locator("#model-note")
    note.get_by_text("synthetic scenes").first.wait_for(state="visible")
    assert "arrcoc-texture" in note.inner_text() and re.search(r"pointing game, 0\.\d{3}", note.inner_text())
    shot(page, "07-model-note", full=False)
    page.locator("#model-note").get_by_text("About the model").first.click()
    limit = page.get_by_text(re.compile("^LIMIT"))
    assert limit.first.is_visible(), "the example that shows the model's limit is not labelled"
    before = (
        page.locator("#relevance-map img").get_attribute("src")
        if page.locator("#relevance-map img").count()
        else None
    )
    page.get_by_text("colour · the black one (pupils)", exact=True).first.click()  # no Run pressed
    page.wait_for_function("() => document.querySelector('#query textarea')?.value === 'the black one'")
    # the empty state says "press Run — or click an example": the click runs it, every view included
    page.wait_for_function(
        "(s) => { const i = document.querySelector('#relevance-map img'); return i && i.complete && i.naturalWidth > 0"
        " && i.getAttribute('src') !== s && (document.querySelector('#summary')?.innerText || '').includes('the black one'); }",
        arg=before,
        timeout=180_000,
    )
    page.wait_for_function(
        "() => (document.querySelector('#views-status')?.innerText || '').includes('All views are drawn for “the black one”')",
        timeout=120_000,
    )
    page.wait_for_timeout(1_000)  # the new photo's reset must not land after the run and wipe it
    assert "the black one" in page.locator("#summary").inner_text()
    assert re.search(r"[Mm]atch( score)?: \d\.\d\d", page.locator("#match").inner_text())
    assert heatmap_pixels(page).std() > 5, "the example's heatmap is blank"
    page.locator("#results").scroll_into_view_if_needed()
    shot(page, "08-example-clicked-and-run")


def test_a_score_above_the_line_on_a_photo_is_a_possible_match_said_beside_it(page, examples_dir):
    """ "the text" on the cat photo scored 0.69 and was shown in green as a match "comparable across
    photos": now a possible match, not green, with the caveat in the same box as the number."""
    page.locator("#photo input[type=file]").set_input_files(str(examples_dir / "chelsea.jpg"))
    page.wait_for_selector("#photo img")
    run_query(page, "the text")
    box = page.locator("#match .arr-match")
    said = box.inner_text()
    assert re.search(r"Match score: \d\.\d\d — a possible match", said), said
    assert "Not calibrated on photos" in said and "comparable across photos" not in said, said
    red, green, blue = (
        float(c) for c in re.findall(r"[\d.]+", box.evaluate("e => getComputedStyle(e).backgroundColor"))[:3]
    )
    assert not (green > red + 20 and green > blue + 20), (
        "a possible match is painted as a confirmed (green) one"
    )
    assert box.is_visible() and in_viewport(page, "#match")
    shot(page, "09-possible-match-the-text-on-the-cat", full=False)
    page.locator("#match-views").scroll_into_view_if_needed()
    assert "Not calibrated on photos" in page.locator("#match-views").inner_text()  # above every view too
    shot(page, "09-possible-match-above-the-views", full=False)


def test_long_query_is_refused_in_words(page):
    page.locator("#query textarea").fill("the red one " * 60)
    page.locator("#run").click()
    toast = page.locator(".toast-body, [data-testid='toast-body']").filter(has_text="the limit is")
    toast.first.wait_for(state="visible")
    page.wait_for_timeout(600)
    shot(page, "03-error-long-query", full=False)
    close_toasts(page)


def test_a_new_photo_clears_the_stale_upload_error(page, examples_dir):
    """ "Upload a photo first" stayed beside the next error after a photo was uploaded."""
    page.goto(page.url.split("?")[0])  # a fresh page: no photo yet
    page.wait_for_selector("#run")
    page.locator("#query textarea").fill("the red one")
    page.locator("#run").click()
    toast = page.locator("[data-testid='toast-body']").filter(has_text="Upload a photo first")
    toast.first.wait_for(state="visible")
    page.locator("#photo input[type=file]").set_input_files(str(examples_dir / "coffee.jpg"))
    page.wait_for_selector("#photo img")
    toast.first.wait_for(state="detached", timeout=3_000)  # closed by the upload, not by its own timer
    shot(page, "03-error-cleared-by-upload", full=False)


def test_bad_input_shows_a_message(page):
    page.locator("#query textarea").fill("   ")
    page.locator("#run").click()
    toast = page.locator(".toast-body, [data-testid='toast-body']").filter(has_text="query")
    toast.first.wait_for(state="visible")
    page.wait_for_timeout(600)  # let the toast finish fading in before the screenshot
    assert "Traceback" not in page.content()
    shot(page, "03-error-empty-query", full=False)
    close_toasts(page)


def test_batch_job_download_and_refresh(page, app_url, examples_dir, tmp_path):
    archive = tmp_path / "photos.zip"
    photos = sorted(examples_dir.glob("*.jpg"))
    with zipfile.ZipFile(archive, "w") as zf:
        for p in photos:
            zf.write(p, p.name)
    open_tab(page, "#main-tabs", "Batch")
    said = page.locator("#main-tabs [role=tabpanel]:visible").first.inner_text()
    assert "shown only to the browser that submitted it" in said and "not in another one" in said
    page.locator("#batch-zip input[type=file]").set_input_files(str(archive))
    page.locator("#batch-query textarea").fill("the red one")
    page.locator("#batch-submit").click()
    page.wait_for_function(
        "() => (document.querySelector('#batch-status')?.innerText || '').includes('done')"
    )
    link = page.locator("#batch-results a").first
    link.wait_for(state="visible")
    thumbs = page.locator("#batch-gallery img")
    page.wait_for_function(f"() => document.querySelectorAll('#batch-gallery img').length >= {len(photos)}")
    thumbs.first.scroll_into_view_if_needed()
    assert thumbs.first.is_visible() and thumbs.first.evaluate("i => i.naturalWidth") > 0
    gallery_text = page.locator("#batch-gallery").inner_text()
    for p in photos:  # every thumbnail says which file it is, and its match score
        assert p.name in gallery_text, f"{p.name} missing from the gallery: {gallery_text!r}"
    assert gallery_text.count("match ") >= len(photos) and "top cell: row" in gallery_text
    for fig in page.locator("#batch-gallery figure").all():  # the caption is under the picture, not over it
        img, cap = fig.locator("img").bounding_box(), fig.locator("figcaption").bounding_box()
        assert cap["y"] >= img["y"] + img["height"] - 1
    close_toasts(page)
    settle_images(page, "#batch-gallery")
    shot(page, "04-batch-done")
    job_id = page.locator("#batch-job textarea, #batch-job input").first.input_value()
    assert job_id and f"job={job_id}" in page.url

    with page.expect_download() as dl:
        link.click()
    saved = tmp_path / "results.zip"
    dl.value.save_as(saved)
    with zipfile.ZipFile(saved) as zf:
        assert len(result_rows(zf)) == len(photos)

    page.goto(f"{app_url}?job={job_id}")  # a refresh with the job in the URL shows it again
    page.wait_for_function(
        "(id) => (document.querySelector('#batch-status')?.innerText || '').includes(id)", arg=job_id
    )
    assert "done" in page.locator("#batch-status").inner_text()
    shot(page, "05-batch-after-refresh")
    other = page.context.browser.new_context(viewport=VIEWPORT)  # another browser: no cookie of ours
    try:
        elsewhere = other.new_page()
        elsewhere.goto(f"{app_url}?job={job_id}")
        elsewhere.wait_for_function(
            "() => (document.querySelector('#batch-status')?.innerText || '').includes('whoever submitted it')",
            timeout=45_000,
        )
        assert job_id in elsewhere.locator("#batch-status").inner_text()
        elsewhere.locator("#batch-status").scroll_into_view_if_needed()
        shot(elsewhere, "05-batch-job-from-another-browser", full=False)
    finally:
        other.close()

    open_tab(page, "#main-tabs", "Benchmark")  # a stored report measured like this server, or a clear "none"
    page.wait_for_function(
        "() => /Stored report|No stored report matches/.test(document.querySelector('#bench-report-title')?.innerText || '')"
    )
    shot(page, "06-benchmark-tab")
    if "Stored report" not in page.locator("#bench-report-title").inner_text():
        return
    for chart in ("#bench-latency", "#bench-speedup", "#bench-parity"):  # every chart draws, in colour
        assert coloured_marks(page, chart), f"{chart} draws no coloured marks"
    legend = page.locator("#bench-latency g.legend").first.text_content() or ""
    assert "eager" in legend and "·" not in legend, legend  # one entry per backend, this report's
    page.locator("#bench-latency").scroll_into_view_if_needed()
    shot(page, "06-benchmark-charts", full=False)
    for name in (
        "2026-11-23-h100-texture-onnx-8eb1671.json",
        "2026-11-22-cpu-2core.json",
    ):  # other reports: their own charts
        if (
            name not in page.locator("#bench-stored").inner_text()
            and not (Path(__file__).parent.parent / "benchmarks" / name).exists()
        ):
            continue
        page.locator("#bench-stored input").click()
        page.get_by_role("option", name=name).click()
        page.wait_for_function(
            "(n) => (document.querySelector('#bench-report-title')?.innerText || '').includes(n)", arg=name
        )
        page.wait_for_timeout(500)
        assert coloured_marks(page, "#bench-latency") and coloured_marks(page, "#bench-speedup")
        page.locator("#bench-latency").scroll_into_view_if_needed()
        shot(page, f"06-benchmark-{name.removesuffix('.json')}", full=False)


def test_a_batch_job_without_overlays_shows_each_items_relevance_map(page, examples_dir, tmp_path):
    """The Batch tab asks for relevance overlays unless told otherwise (a person is looking); a job
    submitted with "none" has no pictures in its zip, and its gallery shows each item's relevance map
    from results.parquet, said under each."""
    archive = tmp_path / "two.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ("coffee.jpg", "chelsea.jpg"):
            zf.write(examples_dir / name, name)
    page.goto(page.url.split("?")[0])
    page.wait_for_selector("#run")
    open_tab(page, "#main-tabs", "Batch")
    checked = page.locator("#batch-overlay input:checked")
    assert checked.evaluate("b => b.closest('label').innerText.trim()") == "relevance"
    page.locator("#batch-overlay").get_by_text("none", exact=True).click()
    page.locator("#batch-zip input[type=file]").set_input_files(str(archive))
    page.locator("#batch-query textarea").fill("the red one")
    page.locator("#batch-submit").click()
    page.wait_for_function(
        "() => (document.querySelector('#batch-status')?.innerText || '').includes('done')"
    )
    page.wait_for_function("() => document.querySelectorAll('#batch-gallery img').length >= 2")
    close_toasts(page)
    settle_images(page, "#batch-gallery")
    text = page.locator("#batch-gallery").inner_text()
    assert text.count("relevance map (no overlays drawn)") == 2 and "coffee.jpg" in text, text
    heat = page.locator("#batch-gallery img").first.evaluate(
        "i => { const c = document.createElement('canvas'); c.width = i.naturalWidth; c.height = i.naturalHeight;"
        " const x = c.getContext('2d'); x.drawImage(i, 0, 0); const d = x.getImageData(0, 0, c.width, c.height).data;"
        " let warm = 0; for (let k = 0; k < d.length; k += 4) if (d[k] > 180 && d[k + 2] < 120) warm++;"
        " return warm / (d.length / 4); }"
    )
    assert heat > 0.005, "the map has no bright (warm) cells"
    shot(page, "04-batch-without-overlays")


def test_benchmark_tab_shows_what_the_server_runs_and_names_a_new_jobs_report(page, local_reports):
    """On load: a stored report of this server's variant on its kind of device (never an H100 report
    of another model as if it were ours), its label whole; after a job, the job's report is named in
    the dropdown and the table fits its box; the job says what it is doing while it runs."""
    page.goto(page.url.split("?")[0])
    page.wait_for_selector("#run")
    open_tab(page, "#main-tabs", "Benchmark")
    # the title as a person reads it once the page has settled: Gradio's "processing | 0.7/0.9s"
    # stands above it while the tab's load event runs (a busy machine sees it for a while)
    page.wait_for_function(
        "() => /^(Stored report|No stored report matches)/"
        ".test((document.querySelector('#bench-report-title')?.innerText || '').trim())"
    )
    title = page.locator("#bench-report-title").inner_text().strip()
    chosen = page.locator("#bench-stored input").input_value()
    if title.startswith("Stored report"):  # the test server runs arrcoc-texture on a CPU
        assert (
            re.search(r"measured on a CPU.* on \d{4}-\d\d-\d\d \d\d:\d\d UTC", title) and "H100" not in title
        ), title
        assert "on another machine" in title, title  # beside the figures: they are not this machine's
        assert chosen.startswith("arrcoc-texture · CPU — ") and chosen.endswith(".json"), chosen
        box = page.locator("#bench-stored input")
        assert box.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), "the report's name is cut off"
    else:
        assert "arrcoc-texture" in title and "a CPU" in title, title
    backends, buckets = (
        page.locator(f"{g} input:checked").count() for g in ("#bench-backends", "#bench-buckets")
    )
    assert backends >= 2 and buckets >= 2, "the default job compares nothing (one dot, two empty panels)"
    checked = [
        page.locator(f"{g} input:checked").evaluate_all(
            "bs => bs.map(b => b.closest('label').innerText.trim())"
        )
        for g in ("#bench-backends", "#bench-buckets")
    ]
    assert checked[1] == ["1", "4"], checked  # what `arrcoc bench` runs on a CPU, from the same defaults
    iters = page.locator("#bench-iters input[type=number]").input_value()
    assert iters == "10", iters
    shot(page, "06-benchmark-on-load", full=False)

    # a report `arrcoc bench` wrote on this machine comes first, and is shown on load
    import json

    mine = {
        "schema": "arrcoc-bench/1",
        "env": {
            "gpu": None,
            "device": "cpu",
            "cpu": "x86_64",
            "cpu_count": 2,
            "date": "2026-11-27T10:15:00+00:00",
        },
        "results": [
            dict(variant="arrcoc-texture", backend="eager", bucket=1, p50_ms=157.6, speedup_vs_eager=1.0),
            dict(variant="arrcoc-texture", backend="onnx", bucket=1, p50_ms=60.2, speedup_vs_eager=2.6),
        ],
    }
    (local_reports / "bench-2026-11-27-101500-cpu.json").write_text(json.dumps(mine))
    page.goto(page.url.split("?")[0])
    page.wait_for_selector("#run")
    open_tab(page, "#main-tabs", "Benchmark")
    page.wait_for_function(
        "() => (document.querySelector('#bench-report-title')?.innerText || '').startsWith('Run on this machine')"
    )
    title = page.locator("#bench-report-title").inner_text()
    assert "2026-11-27 10:15 UTC" in title and "another machine" not in title, title
    chosen = page.locator("#bench-stored input").input_value()
    assert chosen == "this machine · arrcoc-texture · CPU — bench-2026-11-27-101500-cpu.json", chosen
    assert coloured_marks(page, "#bench-latency")
    shot(page, "06-benchmark-this-machines-report", full=False)
    (local_reports / "bench-2026-11-27-101500-cpu.json").unlink()
    for group in ("#bench-backends", "#bench-buckets"):  # a quick job for the test: the first of each
        for box in page.locator(f"{group} input:checked").all()[1:]:
            box.uncheck()
    page.locator("#bench-submit").click()
    notes = set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        text = page.locator("#bench-status").inner_text()
        notes.add(text.splitlines()[-1])
        if re.search(r"● (done|failed)", text):
            break
        page.wait_for_timeout(300)
    assert "● done" in text, text
    running = [n for n in notes if "Device held" in n]  # a quick job may finish between two polls
    assert all(not n.endswith("0%: starting") for n in running), running  # each note names its step
    job_id = page.locator("#bench-job input, #bench-job textarea").first.input_value()
    page.wait_for_function(
        "(id) => (document.querySelector('#bench-stored input')?.value || '').includes(id)", arg=job_id
    )
    assert job_id in page.locator("#bench-report-title").inner_text()
    table = page.locator("#bench-table")
    table.scroll_into_view_if_needed()
    overflow = table.evaluate(
        "t => { const b = t.getBoundingClientRect(); return [...t.querySelectorAll('th, td')]"
        ".filter(c => c.getBoundingClientRect().right > b.right + 1).length; }"
    )
    assert overflow == 0, f"{overflow} table cells stick out of the results box"
    shot(page, "06-benchmark-after-job")
