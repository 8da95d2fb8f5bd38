"""The demo's pure parts: view metrics, benchmark-report parsing, batch archives (no server)."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

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
    "schema": 1, "env": {"gpu": "NVIDIA H100", "torch": "2.13.0"}, "recompiles_after_warmup": 0,
    "results": [
        {"variant": "arrcoc-texture", "backend": "eager", "bucket": 1, "p50_ms": 10.0, "p99_ms": 12.0,
         "throughput_per_s": 100, "speedup_vs_eager": 1.0, "max_abs_diff": 0.0, "topk_agreement": 1.0},
        {"variant": "arrcoc-texture", "backend": "compiled", "bucket": 1, "p50_ms": 1.0, "p99_ms": 1.5,
         "throughput_per_s": 1000, "speedup_vs_eager": 10.0, "max_abs_diff": 2e-6, "topk_agreement": 1.0},
    ],
}  # fmt: skip


def test_report_tables_and_plots(tmp_path):
    from demo import jobs

    df = jobs.report_frame(HARNESS_REPORT)
    assert df["backend"].tolist() == ["eager", "compiled"]
    latency, speedup, parity = jobs.plot_frames(df)
    assert latency["value"].tolist() == [10.0, 1.0] and speedup["value"].tolist() == [10.0]
    assert speedup["bucket"].tolist() == ["1 · compiled"] and parity["value"].tolist() == [2e-6]
    assert "NVIDIA H100" in jobs.report_markdown(HARNESS_REPORT, "h100.json")
    assert "No benchmark report yet" in jobs.report_markdown(None, "")
    # a report without speedups (the service's fallback timer) gets them from p50
    slim = {"results": [dict(backend="eager", variant="v", bucket=1, p50_ms=4.0),
                        dict(backend="onnx", variant="v", bucket=1, p50_ms=2.0)]}  # fmt: skip
    assert jobs.report_frame(slim)["speedup_vs_eager"].tolist() == [1.0, 2.0]
    # the newest readable report in a folder is the one shown on load
    (tmp_path / "old.json").write_text(json.dumps(slim))
    (tmp_path / "broken.json").write_text("{")
    assert jobs.newest_report(tmp_path)[1] == "old.json"
    assert jobs.newest_report(tmp_path / "missing") == (None, "")
    (tmp_path / "batching.json").write_text(json.dumps({"results": [{"batch": 8}]}))  # not a benchmark report
    assert jobs.stored_reports(tmp_path) == ["old.json"]
    assert jobs.stored_report("../../old.json", tmp_path) is not None  # a bare name; no path from the page
    files = jobs.report_files(HARNESS_REPORT, "r")
    assert [f.rsplit(".", 1)[1] for f in files] == ["json", "csv"]


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
    assert {d.api_name for d in page.fns.values()} >= {"infer", "run", "batch_submit", "batch_status", "bench_submit"}


def test_arrcoc_demo_command():
    from arrcoc.cli import build_parser

    args = build_parser().parse_args(["demo", "--port", "7999", "--host", "0.0.0.0"])
    assert (args.port, args.host) == (7999, "0.0.0.0") and args.func.__module__ == "arrcoc.cli.demo"
