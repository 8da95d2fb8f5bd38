"""The demo's pure parts: view metrics, benchmark-report parsing, batch archives (no server)."""

from __future__ import annotations

import base64
import io
import json
import re
import zipfile

import numpy as np
import pytest
from PIL import Image

from arrcoc import metrics


@pytest.mark.parametrize("grid", [8, 32])
def test_uniform_selection_has_k_distinct_cells_spread_evenly(grid):
    for k in range(1, grid * grid + 1, 7):
        cells = metrics.uniform_selection(grid, k)
        assert len(set(cells.tolist())) == k and cells.min() >= 0 and cells.max() < grid * grid
    if grid == 32:
        assert metrics.coverage(metrics.uniform_selection(grid, 200), grid) == 1.0


def test_selection_metrics_on_known_layouts():
    g = 32
    block = np.array([r * g + c for r in range(10) for c in range(10)])  # one 10x10 square, top left
    m = metrics.selection_metrics(np.ones((g, g)), block)
    assert m.clusters == 1 and m.mean_nn_distance == 1.0
    assert m.coverage == pytest.approx(4 / 16)  # rows/cols 0-9 touch regions 0 and 1 (8 cells each)
    spread = metrics.selection_metrics(np.ones((g, g)), metrics.uniform_selection(g, 16))
    assert spread.spatial_entropy == pytest.approx(1.0) and spread.clusters == 16
    assert metrics.spatial_entropy(np.array([0, 1, 2]), g) == 0.0
    rel = np.zeros((g, g))
    rel[0, :4] = 1.0
    assert metrics.relevance_captured(rel, np.array([0, 1])) == pytest.approx(0.5)


def test_cluster_count_uses_8_connectivity():
    m = np.zeros((5, 5), dtype=bool)
    m[0, 0] = m[1, 1] = True  # diagonal neighbours: one cluster
    m[3, 3] = m[3, 4] = True
    m[0, 4] = True
    assert metrics.cluster_count(m) == 3


def test_query_impact_and_attribution():
    g = 8
    a = np.zeros((g, g))
    a[0, 0] = 1
    b = np.zeros((g, g))
    b[g - 1, g - 1] = 1
    imp = metrics.query_impact(a, np.array([0, 1]), b, np.array([1, 63]))
    assert imp.overlap == 1 and imp.jaccard == pytest.approx(1 / 3)
    assert imp.gained.tolist() == [0] and imp.lost.tolist() == [63]
    assert imp.centroid_shift == pytest.approx(np.hypot(g - 1, g - 1))
    rel = np.random.default_rng(0).random((g, g))
    tex = np.stack([rel, -rel, np.ones((g, g))])
    np.testing.assert_allclose(metrics.channel_attribution(tex, rel), [1.0, -1.0, 0.0], atol=1e-9)


HARNESS_REPORT = {
    "schema": 1,
    "env": {"gpu": "NVIDIA H100", "torch": "2.13.0"},
    "recompiles_after_warmup": 0,
    "results": [
        {
            "variant": "arrcoc-texture",
            "backend": "eager",
            "bucket": 1,
            "p50_ms": 10.0,
            "p99_ms": 12.0,
            "throughput_per_s": 100,
            "speedup_vs_eager": 1.0,
            "max_abs_diff": 0.0,
            "topk_agreement": 1.0,
        },
        {
            "variant": "arrcoc-texture",
            "backend": "compiled",
            "bucket": 1,
            "p50_ms": 1.0,
            "p99_ms": 1.5,
            "throughput_per_s": 1000,
            "speedup_vs_eager": 10.0,
            "max_abs_diff": 2e-6,
            "topk_agreement": 1.0,
        },
    ],
}


def test_report_tables_and_plots(tmp_path):
    from demo import charts, reports

    df = reports.report_frame(HARNESS_REPORT)
    assert df["backend"].tolist() == ["eager", "compiled"]
    latency, speedup, parity = charts.report_figures(df)
    assert [(t.name, list(t.y)) for t in latency.data] == [("eager", [10.0]), ("compiled", [1.0])]
    assert [(t.name, list(t.x), list(t.y)) for t in speedup.data] == [("compiled", ["1"], [10.0])]
    assert [list(t.y) for t in parity.data] == [[2e-6]]
    for fig in (latency, speedup, parity):  # one colour per backend, in every chart
        for t in fig.data:
            assert t.marker.color == charts.BACKEND_COLOURS[t.name]
    assert "NVIDIA H100" in reports.report_markdown(HARNESS_REPORT, "h100.json")
    assert "No benchmark report yet" in reports.report_markdown(None, "")
    # a report without speedups (the service's fallback timer) gets them from p50
    slim = {
        "results": [
            dict(backend="eager", variant="v", bucket=1, p50_ms=4.0),
            dict(backend="onnx", variant="v", bucket=1, p50_ms=2.0),
        ]
    }
    assert reports.report_frame(slim)["speedup_vs_eager"].tolist() == [1.0, 2.0]
    # nor parity: its chart says so (a timing-only report on load raised KeyError: the tab stayed empty)
    latency, speedup, parity = charts.report_figures(reports.report_frame(slim))
    assert len(latency.data) == 2 and "does not measure" in parity.layout.annotations[0].text
    # the newest readable report in a folder is the one shown on load
    (tmp_path / "old.json").write_text(json.dumps(slim))
    (tmp_path / "broken.json").write_text("{")
    assert reports.newest_report(tmp_path)[1] == "old.json"
    assert reports.newest_report(tmp_path / "missing") == (None, "")
    (tmp_path / "batching.json").write_text(json.dumps({"results": [{"batch": 8}]}))  # not a benchmark report
    assert reports.stored_reports(tmp_path) == ["old.json"]
    assert reports.stored_report("../../old.json", tmp_path) is not None  # a bare name; no path from the page
    files = reports.report_files(HARNESS_REPORT, "r")
    assert [f.rsplit(".", 1)[1] for f in files] == ["json", "csv"]


def test_the_stored_report_shown_is_one_measured_like_this_server(tmp_path, monkeypatch):
    """An H100 report of another variant is never shown as this CPU server's; a CPU report of the
    served variant is; with none, the page says so."""
    from demo import reports

    monkeypatch.setattr(reports, "LOCAL_DIR", tmp_path / "nothing-run-here")

    h100 = {**HARNESS_REPORT, "env": {"gpu": "NVIDIA H100 80GB HBM3", "device": "cuda", "date": "2026-11-24"}}
    h100["results"] = [dict(r, variant="arrcoc-clip-b16") for r in HARNESS_REPORT["results"]]
    cpu = {**HARNESS_REPORT, "env": {"gpu": None, "device": "cpu", "date": "2026-11-22"}}
    (tmp_path / "2026-11-24-h100-clip.json").write_text(json.dumps(h100))
    server = reports.Machine("arrcoc-texture", "cpu")
    assert reports.matching_report(server, tmp_path) == (None, "")  # the newest is not ours: not shown
    (tmp_path / "2026-11-22-cpu.json").write_text(json.dumps(cpu))
    assert reports.matching_report(server, tmp_path)[1] == "2026-11-22-cpu.json"
    assert reports.matching_report(reports.Machine("arrcoc-clip-b16", "NVIDIA H100 80GB HBM3"), tmp_path)[
        1
    ] == ("2026-11-24-h100-clip.json")
    assert reports.matching_report(reports.Machine("arrcoc-clip-b16", ""), tmp_path)[1]  # a queue: any device
    label = reports.report_label("2026-11-24-h100-clip.json", h100)
    assert label == "arrcoc-clip-b16 · H100 — 2026-11-24-h100-clip.json"
    assert "measured on **a CPU" in reports.report_markdown(cpu, "x")


def test_this_machines_reports_come_first_and_a_stored_one_says_it_was_measured_elsewhere(
    tmp_path, monkeypatch
):
    """A stored CPU report was 12x off what this machine ran: the title says on which device and
    date it was measured, and that it was another machine; a report `arrcoc bench` wrote here
    (its default folder) is listed first and shown on load instead."""
    from demo import reports

    stored, here = tmp_path / "benchmarks", tmp_path / "bench-out"
    stored.mkdir()
    cpu = {
        **HARNESS_REPORT,
        "env": {
            "gpu": None,
            "device": "cpu",
            "cpu": "x86_64",
            "cpu_count": 2,
            "date": "2026-11-22T07:55:27+00:00",
        },
    }
    cpu["results"] = [dict(r, variant="arrcoc-texture") for r in HARNESS_REPORT["results"]]
    (stored / "2026-11-22-cpu-2core.json").write_text(json.dumps(cpu))
    monkeypatch.setattr(reports, "LOCAL_DIR", here)  # no folder yet: nothing run here
    server = reports.Machine("arrcoc-texture", "cpu")
    report, name = reports.matching_report(server, stored)
    assert name == "2026-11-22-cpu-2core.json"
    title = reports.report_markdown(report, reports.report_source(name))
    assert title.startswith("**Stored report: benchmarks/2026-11-22-cpu-2core.json**")
    assert "measured on **a CPU (x86_64, 2 cores)** on **2026-11-22 07:55 UTC**" in title
    assert "on another machine" in title
    here.mkdir()  # `arrcoc bench` ran here: its report, older than the stored one, comes first all the same
    mine = {**cpu, "env": {**cpu["env"], "date": "2026-11-20T16:52:00+00:00"}}
    (here / "bench-2026-11-20-165200-cpu.json").write_text(json.dumps(mine))
    assert reports.report_choices(stored) == [
        "here:bench-2026-11-20-165200-cpu.json",
        "2026-11-22-cpu-2core.json",
    ]
    report, name = reports.matching_report(server, stored)
    assert name == "here:bench-2026-11-20-165200-cpu.json" and report == mine
    title = reports.report_markdown(report, reports.report_source(name))
    assert title.startswith("**Run on this machine: ") and "another machine" not in title
    assert reports.report_label(name, report) == (
        "this machine · arrcoc-texture · CPU — bench-2026-11-20-165200-cpu.json"
    )
    assert reports.stored_report("here:../benchmarks/2026-11-22-cpu-2core.json") is None  # a bare name only


def test_the_default_benchmark_on_a_cpu_is_what_arrcoc_bench_runs_there():
    """The page's first click and `arrcoc bench` on a CPU read one set of defaults (they differed:
    buckets 1 and 8 with 5 iterations on the page, 1 and 4 with 10 on the command line)."""
    import argparse

    import torch

    from arrcoc.cli import bench
    from arrcoc.settings import Settings
    from demo.tabs.bench import default_job

    backends, buckets, iters = default_job(Settings(engine={"buckets": (1, 2, 4, 8, 16, 32, 64)}))
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    cli = parser.parse_args(["bench"])
    bench._resolve(cli, torch.device("cpu"))
    assert backends == cli.backends and len(backends) >= 2
    assert buckets == [str(b) for b in cli.buckets] == ["1", "4"] and iters == cli.iters == 10


def test_batch_archive_gets_the_uploaded_manifest(tmp_path, examples_dir):
    from arrcoc.errors import InvalidInputError
    from demo import jobs

    z = tmp_path / "in.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.write(examples_dir / "coffee.jpg", "coffee.jpg")
    manifest = tmp_path / "queries.csv"
    manifest.write_text("file,query\ncoffee.jpg,the cup\n")
    with zipfile.ZipFile(io.BytesIO(jobs.build_archive(str(z), str(manifest)))) as zf:
        assert sorted(zf.namelist()) == ["coffee.jpg", "manifest.csv"]
        assert zf.read("manifest.csv").decode().startswith("file,query")
    with pytest.raises(InvalidInputError, match="Upload a .zip"):
        jobs.build_archive(None, None)
    with pytest.raises(InvalidInputError, match="manifest must be"):
        jobs.build_archive(str(z), str(examples_dir / "coffee.jpg"))


def test_building_the_page_loads_no_model():
    from demo import service
    from demo.app import build_demo

    service.set_executor(None)
    page = build_demo()
    assert service._executor is None  # the executor (and the model) come with the first request
    api = {d.api_name for d in page.fns.values() if d.api_visibility == "public"}
    assert api == {
        "infer",
        "infer_foveated",
        "run",
        "batch_submit",
        "batch_status",
        "batch_cancel",
        "bench_submit",
        "bench_status",
    }


def test_arrcoc_demo_command():
    from arrcoc.cli import build_parser

    args = build_parser().parse_args(["demo", "--port", "7999", "--host", "0.0.0.0"])
    assert (args.port, args.host) == (7999, "0.0.0.0") and args.func.__module__ == "arrcoc.cli.demo"


def test_charts_facet_variants_and_group_buckets():
    from demo import charts, reports

    rows = [
        dict(variant=v, backend=b, bucket=n, p50_ms=p, speedup_vs_eager=s, max_abs_diff=d)
        for v in ("arrcoc-texture", "arrcoc-clip-b16")
        for n in (1, 8)
        for b, p, s, d in (("eager", 10.0, 1.0, 0.0), ("compiled", 2.0, 5.0, 1e-6), ("onnx", 4.0, 2.5, 2e-6))
    ]
    df = reports.report_frame({"results": rows})
    latency, speedup, _ = charts.report_figures(df)
    assert {t.xaxis for t in latency.data} == {"x", "x2"}  # one panel per variant
    assert [t.name for t in latency.data if t.showlegend] == [
        "eager",
        "compiled",
        "onnx",
    ]  # one legend entry each
    assert speedup.layout.barmode == "group" and {tuple(t.x) for t in speedup.data} == {("1", "8")}
    assert "No report" in charts.latency(reports.report_frame(None)).layout.annotations[0].text


def _replace(result, **changes):
    import dataclasses

    return dataclasses.replace(result, **changes)


def _result(match: float | None, query: str = "the red one"):
    from arrcoc.result import RelevanceResult

    g = 32
    rel = np.random.default_rng(0).random((g, g))
    return RelevanceResult(
        variant="arrcoc-texture",
        weights_version="v",
        backend="eager",
        query=query,
        relevance=rel,
        information=rel,
        perspectival=rel,
        participatory=rel,
        balance=np.array([0.2, 0.2, 0.6]),
        tensions=np.zeros(3),
        selected=np.array([33, 0]),
        budgets=np.array([400, 64]),
        budget_map=np.zeros((g, g)),
        texture=np.zeros((13, g, g)),
        image_size=(600, 400),
        token_budget=25600,
        match_score=match,
    )


def test_the_foveated_tab_shows_the_foveated_view_beside_vs_uniform():
    """Every view tab gets its value from render_views in order; the foveated tab follows "vs uniform"
    and shows the photo sharp in the selected cells only."""
    import gradio as gr
    from PIL import Image

    from demo import views
    from demo.tabs.infer import render_views
    from demo.tabs.infer_views import view_tabs

    with gr.Blocks():
        rest, *_ = view_tabs()
        tabs = [b.label for b in gr.context.Context.root_block.blocks.values() if isinstance(b, gr.Tab)]
    assert tabs.index("foveated") == tabs.index("vs uniform") + 1
    pixels = np.random.default_rng(1).integers(0, 256, (400, 600, 3), dtype=np.uint8)
    run = views.Run(image=Image.fromarray(pixels), result=_result(0.9))
    budget_map = np.zeros((32, 32))
    budget_map.flat[[33, 0]] = [400, 64]
    run = views.Run(image=run.image, result=_replace(run.result, budget_map=budget_map))
    out = render_views(run, "relevance (balanced)", 0.5)
    assert len(out) == len(rest) == len(render_views(None, "", 0.0))
    at = next(i for i, c in enumerate(rest) if getattr(c, "elem_id", None) == "foveated")
    view = np.asarray(out[at])
    assert view.shape == pixels.shape and "2 selected cells" in out[at + 1]
    assert (view[:12, :18] == pixels[:12, :18]).all(), "the selected top-left cell keeps the photo's pixels"
    assert np.abs(view[200:].astype(float) - pixels[200:]).mean() > 20, "the rest: a low base resolution"


def test_match_score_is_shown_and_weak_matches_say_so():
    from arrcoc.result import WEAK_MATCH
    from demo import views

    strong, weak = _result(0.91), _result(WEAK_MATCH - 0.1, "a <giraffe>")
    assert "Match score: 0.91" in views.match_html(strong) and "Weak" not in views.match_html(strong)
    assert "Weak match" in views.match_html(weak)
    assert "&lt;giraffe&gt;" in views.match_html(weak)  # the query is escaped
    assert "**weak match**" in views.summary_markdown(weak) and "0.91" in views.summary_markdown(strong)
    assert "18.8 × 12.5 px" in views.summary_markdown(strong)  # a 600x400 photo's cell is not 16x16
    assert "run the model" in views.match_html(None)
    assert "not reported" in views.match_html(_result(None))


def test_a_score_above_the_line_is_a_possible_match_with_its_caveat_beside_it():
    """ "the text" scored 0.69 on the cat photo and 0.82 on the coffee photo, both shown in green
    as a match "comparable across photos": a score above the line is shown as a possible match, in
    the page's neutral colour, with the caveat in the same box as the number."""
    from demo import page, views

    html = views.match_html(_result(0.69, "the text"))
    assert "arr-match-unsure" in html and "arr-match-ok" not in html
    number, caveat = html.index("0.69"), html.index("Not calibrated on photos")
    assert number < caveat and html.count("<div") == 1  # one box: the caveat is beside the score
    assert "comparable across photos" not in html and "not kinds of objects" in html
    css = page.CSS.split(".arr-match-unsure", 1)[1].split("}", 1)[0]
    assert "22,163,74" not in css and "green" not in css  # not the green of a confirmed find
    assert "possible match; not calibrated on photos" in views.summary_markdown(_result(0.69, "the text"))
    assert "comparable across photos" not in views.summary_markdown(_result(0.69, "the text"))


@pytest.mark.parametrize(
    ("query", "score", "says", "never"),
    [
        # the map rings both eyes of the cat at 0.13: the banner says what the score rates and that
        # the bright cells are candidates to check, neither "noise" nor a find
        (
            "the cat's eyes",
            0.13,
            ["Weak match: 0.13", "resembles", "best candidates", "Check them"],
            ["noise", "names a place", "matches something"],
        ),
        ("a giraffe", 0.02, ["Weak match: 0.02", "may or may not"], ["noise", "names a place"]),
        # position-only queries: the extra sentence, and only for them
        (
            "the top left",
            0.2,
            ["Weak match: 0.20", "names a place, not a thing", "points the right way"],
            ["noise"],
        ),
        ("the left side", 0.3, ["names a place"], []),
        ("the red one in the top left", 0.3, ["Weak match"], ["names a place"]),
        (
            "the red one",
            0.67,
            ["Match score: 0.67 — a possible match", "Not calibrated on photos", "check the bright cells"],
            ["Weak", "names a place", "noise", "comparable across photos"],
        ),
    ],
)
def test_weak_match_banner_says_what_the_score_means_for_this_query(query, score, says, never):
    from demo import views

    html = views.match_html(_result(score, query))
    for text in says:
        assert text in html.replace("&#x27;", "'"), (text, html)
    for text in never:
        assert text not in html, (text, html)


def test_batch_view_reads_the_results_zip(tmp_path):
    """The gallery reads results.parquet's small columns and the overlays from the zip; the status
    is the job record's counts and the results' names, not the rows."""
    import numpy as np
    from PIL import Image

    from arrcoc.service.host.interface import StepOutputs
    from arrcoc.service.jobs.results import step_table, to_bytes
    from arrcoc.service.jobs.types import JobKind, JobState, JobStatus
    from demo import batchview

    z = tmp_path / "results.zip"
    out = StepOutputs.failed(2, 32, 2)
    out.ok[0], out.selected[0], out.match_score[0], out.budgets[0] = True, [70, 1], 0.3, [60, 40]
    out = StepOutputs(**{**out.__dict__, "backend": "eager"})
    table = step_table(
        [(0, "a.jpg", "the red one"), (1, "b.jpg", "the red one")],
        out,
        [None, "not an image"],
        ["overlays/00000_a.png", None],
    )
    png = io.BytesIO()
    Image.new("RGB", (40, 30), "red").save(png, format="PNG")
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("results.parquet", to_bytes(table))
        zf.writestr("overlays/00000_a.png", png.getvalue())
    shown, failures = batchview.gallery(z)
    assert shown.count("<figure") == 1 and "data:image/jpeg;base64," in shown  # failed items have no overlay
    assert (
        "<b>a.jpg</b>" in shown
        and "match <b>0.30</b>" in shown
        and "weak match" in shown
        and "row 2, col 6" in shown
    )
    assert "b.jpg" in failures and "not an image" in failures
    items = batchview.item_rows(z)
    assert (
        items[0]["top_cell"] == {"row": 2, "col": 6}
        and items[0]["tokens_used"] == 100
        and np.isclose(items[0]["match_score"], 0.3)
    )
    assert items[1] == {
        "index": 1,
        "file": "b.jpg",
        "query": "the red one",
        "ok": False,
        "error": "not an image",
    }
    st = JobStatus("batch-x", JobKind.BATCH, JobState.DONE, total=2, done=1, failed=1)
    doc = batchview.status_json(st, z)
    json.dumps(doc)  # plain JSON
    assert doc["state"] == "done" and (doc["done"], doc["failed"]) == (1, 1) and "items" not in doc
    assert doc["results"]["rows"] == "results.parquet" and doc["results"]["overlays"] == "overlays/"


def test_a_job_without_overlays_shows_each_items_relevance_map(tmp_path):
    """A job submitted with overlays "none" has results.parquet and summary.csv only: its gallery
    draws each item's relevance map from results.parquet (hot where the map peaks, at the photo's
    aspect ratio), and its status says there are no overlays."""
    from arrcoc.render import colorize
    from arrcoc.service.host.interface import StepOutputs
    from arrcoc.service.jobs.results import step_table, to_bytes
    from arrcoc.service.jobs.types import JobKind, JobState, JobStatus
    from demo import batchview

    out = StepOutputs.failed(2, 32, 2)
    out.ok[:] = True
    out.selected[:], out.match_score[:], out.budgets[:] = [[70, 1], [0, 1]], [0.3, 0.8], [[60, 40], [64, 64]]
    out.relevance[0].flat[70] = 1.0  # row 2, col 6
    out.relevance[1].flat[0] = 1.0
    out.image_size[:] = [[600, 400], [300, 600]]
    out = StepOutputs(**{**out.__dict__, "backend": "eager"})
    table = step_table(
        [(0, "a.jpg", "the red one"), (1, "b.jpg", "the red one")], out, [None, None], [None, None]
    )
    z = tmp_path / "results.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("results.parquet", to_bytes(table))
    shown, failures = batchview.gallery(z)
    assert shown.count("<figure") == 2 and shown.count(batchview.MAP_NOTE) == 2 and not failures
    uris = re.findall(r'src="data:image/jpeg;base64,([^"]+)"', shown)
    pictures = [Image.open(io.BytesIO(base64.b64decode(u))).convert("RGB") for u in uris]
    assert pictures[0].size == (320, 213) and pictures[1].size == (160, 320)  # each photo's aspect
    hot, cold = (colorize(np.array([[v]]), 0.0, 1.0)[0, 0].astype(float) for v in (1.0, 0.0))
    a = np.asarray(pictures[0], dtype=float)
    cell = a[int(2.5 * 213 / 32), int(6.5 * 320 / 32)]  # the centre of row 2, col 6
    assert np.abs(cell - hot).mean() < 30 and np.abs(a[150, 250] - cold).mean() < 30
    st = JobStatus("batch-x", JobKind.BATCH, JobState.DONE, total=2, done=2, failed=0)
    assert batchview.status_json(st, z)["results"]["overlays"] is None


def test_the_page_reads_the_variant_and_settings():
    from arrcoc.registry import get_variant
    from arrcoc.settings import get_settings
    from demo import app, inputs
    from demo.page import CSS
    from demo.tabs import infer

    page = app.build_demo()
    config = get_variant(get_settings().engine.variant).config
    sliders = {c.label: c for c in page.blocks.values() if type(c).__name__ == "Slider"}
    k = next(c for label, c in sliders.items() if label and label.startswith("K "))
    assert (k.maximum, k.value) == (config.grid**2, config.k)
    assert sliders["token budget"].value == config.token_budget
    backend = next(c for c in page.blocks.values() if getattr(c, "elem_id", None) == "backend")
    assert backend.value == infer.SERVER_DEFAULT and infer._backend(backend.value) is None
    assert "footer" not in CSS  # the "Use via API" link stays visible
    with pytest.raises(Exception, match="the limit is"):
        inputs.query_text("x" * (get_settings().limits.max_query_chars + 1))


# Where each example of the page must land (rows, cols of the 32x32 grid, inclusive), checked by
# looking at the photos: the examples promise what the default model grounds.
EXAMPLE_REGIONS = {
    ("chelsea.jpg", "the black one"): ((9, 16), (9, 25)),  # the two pupils
    ("coffee.jpg", "the red one"): ((10, 16), (20, 25)),  # the red cup's handle side
    ("astronaut.jpg", "the orange"): ((13, 31), (0, 31)),  # the orange suit, lower half
    ("astronaut.jpg", "the text"): ((21, 28), (8, 12)),  # the mission patch with its lettering
    ("coffee.jpg", "the top left"): ((0, 10), (0, 10)),
    ("shapes.jpg", "the green circle in the top right"): ((0, 12), (19, 31)),
    ("shapes.jpg", "the largest shape"): ((0, 12), (19, 31)),  # the green circle again
}


def test_examples_ground_where_their_labels_say():
    from arrcoc import RelevancePipeline
    from demo.tabs.infer import EXAMPLES, EXAMPLES_DIR

    pipe = RelevancePipeline(backend="eager", device="cpu")
    if pipe.weights_version == "untrained":
        pytest.skip("no trained weights")
    for f, query, label in EXAMPLES:
        [r] = pipe.infer([EXAMPLES_DIR / f], query)
        if label.startswith("LIMIT"):
            assert r.weak_match, (label, r.match_score)  # the page says the score calls it weak
            continue
        if not label.startswith("position"):  # the page says a position query scores low
            assert not r.weak_match, (label, r.match_score)  # an example the model answers well
        (r0, r1), (c0, c1) = EXAMPLE_REGIONS[(f, query)]
        cells = [divmod(int(i), r.grid) for i in r.selected[:5]]
        inside = [r0 <= y <= r1 and c0 <= x <= c1 for y, x in cells]
        assert inside[0] and sum(inside) >= 3, (label, cells)


def test_progress_says_what_is_happening(monkeypatch):
    from demo import service
    from demo.tabs import infer

    monkeypatch.setattr(service, "is_ready", lambda backend: False)
    assert (
        "compiling" in infer.progress_note("compiled") and "first run" in infer.progress_note("eager").lower()
    )
    monkeypatch.setattr(service, "is_ready", lambda backend: True)
    assert infer.progress_note("onnx") == "Running the model (onnx)"


def test_a_benchmark_says_what_it_is_doing_before_each_step():
    """A job said only "0%: starting" while the model loaded and eager warmed up: now each step's
    note comes before it starts."""
    from arrcoc.bench.harness import BenchConfig, run_benchmark

    notes: list[tuple[float, str]] = []
    config = BenchConfig(
        variants=("arrcoc-texture",),
        backends=("eager",),
        buckets=(1,),
        iters=2,
        warmup_iters=1,
        device="cpu",
        weights=None,
        input_sets=1,
    )
    run_benchmark(config, progress=lambda f, m: notes.append((f, m)))
    said = [m for _, m in notes]
    first = {m: said.index(m) for m in dict.fromkeys(said)}
    assert said[0] == "arrcoc-texture: loading the model" and notes[0][0] == 0.0
    assert (
        first["arrcoc-texture: preparing eager (building and warming up)"]
        < first["arrcoc-texture: eager ready"]
    )
    assert first["arrcoc-texture: timing batches of 1"] < first["arrcoc-texture: bucket 1"]
    assert "timing" not in said  # every note names its step


def test_a_batch_from_the_page_pays_by_its_address(tmp_path, monkeypatch):
    """The demo hands the executor the payer of the submitter's address, so new sessions of one
    address share one disk share: the job's reservation names the address, not the session."""
    from arrcoc.request import Controls
    from arrcoc.service.client.inprocess import InProcessExecutor
    from arrcoc.settings import default_settings
    from demo import jobs, service

    ex = InProcessExecutor(
        default_settings(service={"data_dir": tmp_path / "data"}, engine={"device": "cpu"})
    )
    monkeypatch.setattr(service, "executor", lambda: ex)
    z = tmp_path / "a.zip"
    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(buf, "PNG")
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("a.png", buf.getvalue())
    try:
        job = jobs.submit_batch(str(z), None, "the sky", Controls(), owner="session:q", address="203.0.113.7")
        reserved = json.loads((tmp_path / "data" / "jobs" / job / "reserved.json").read_text())
        assert (reserved["owner"], reserved["payer"]) == ("session:q", "address:203.0.113.7")
    finally:
        ex.close()
