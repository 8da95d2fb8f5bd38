"""The benchmark harness on CPU: a tiny run (bucket 1, few iterations), its report and renderers."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from arrcoc.bench import SCHEMA, BenchConfig, run_benchmark
from arrcoc.bench.report import markdown_table, write_all
from arrcoc.bench.timing import summarize

# the engine tests' cache: the bench's aot run (cache/aot) loads the package test_engine built
CACHE = Path(tempfile.gettempdir()) / "arrcoc-test-engine-cache"
RESULT_KEYS = {
    "variant",
    "backend",
    "bucket",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "mean_ms",
    "std_ms",
    "throughput_per_s",
    "speedup_vs_eager",
    "max_abs_diff",
    "topk_agreement",
    "compile_s",
    "capture_s",
    "break_even_calls",
    "parity_ok",
    "recompiles_after_warmup",
}
ENV_KEYS = {"gpu", "driver", "cuda", "torch", "triton", "onnxruntime", "providers", "commit", "date"}


@pytest.fixture(scope="module")
def report():
    progress = []
    config = BenchConfig(
        variants=("arrcoc-texture",),
        backends=("eager", "onnx", "aot"),
        buckets=(1,),
        iters=4,
        warmup_iters=1,
        device="cpu",
        weights=None,
        cache_dir=CACHE,
        input_sets=2,
    )
    r = run_benchmark(config, progress=lambda f, m: progress.append((f, m)))
    r["_progress"] = progress
    return r


def test_tiny_cpu_benchmark_report(report):
    assert report["schema"] == SCHEMA
    assert ENV_KEYS <= set(report["env"]) and report["env"]["gpu"] is None
    assert report["recompiles_after_warmup"] == 0 and report["errors"] == []
    rows = {r["backend"]: r for r in report["results"]}
    assert set(rows) == {"eager", "onnx", "aot"}
    for r in rows.values():
        assert RESULT_KEYS <= set(r)
        assert r["iters"] == 4 and r["p50_ms"] > 0 and r["p99_ms"] >= r["p50_ms"]
        assert r["parity_ok"] and r["topk_agreement"] == 1.0
    assert rows["eager"]["speedup_vs_eager"] == 1.0 and rows["eager"]["max_abs_diff"] == 0.0
    assert rows["onnx"]["compile_s"] > 0
    aot = next(w for w in report["warmup"] if w["backend"] == "aot")
    assert aot["load_s"] > 0 and "build_s" in aot and "peak_mem_mb" not in aot  # (peak memory: GPU only)
    assert report["_progress"][-1][0] == pytest.approx(1.0)
    json.dumps({k: v for k, v in report.items() if k != "_progress"})  # JSON-safe


def test_report_renders_markdown_html_png(report, tmp_path):
    report = {k: v for k, v in report.items() if k != "_progress"}
    paths = write_all(report, tmp_path / "bench-test")
    names = {p.suffix for p in paths}
    assert {".json", ".md", ".html"} <= names
    assert "<svg" in (tmp_path / "bench-test.html").read_text()
    table = markdown_table(report)
    assert "| arrcoc-texture | onnx | 1 |" in table and "| arrcoc-texture | aot | 1 |" in table
    assert "peak MB" in table


def test_cli_render_merges_reports(report, tmp_path, capsys):
    from arrcoc.cli import main

    report = {k: v for k, v in report.items() if k != "_progress"}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(report))
    b.write_text(
        json.dumps(
            {
                **report,
                "results": report["results"][:1],
                "startup": [
                    {
                        "variant": "arrcoc-texture",
                        "backend": "onnx",
                        "cold_s": 10.0,
                        "warm_s": 2.0,
                        "warm_over_cold": 0.2,
                    },
                    {
                        "variant": "arrcoc-texture",
                        "backend": "aot",
                        "cold_s": 60.0,
                        "warm_s": 3.0,
                        "warm_over_cold": 0.05,
                        "cold_stats": {"build_s": 55.0, "load_s": 0.5, "capture_s": 1.2},
                    },
                ],
            }
        )
    )
    assert main(["bench", "--render", str(a), str(b), "--out", str(tmp_path), "--name", "merged"]) == 0
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert len(merged["results"]) == 4 and merged["startup"][0]["warm_s"] == 2.0
    out = capsys.readouterr().out
    assert "warm / cold" in out and "| arrcoc-texture | aot | 60.0 | 3.0 |" in out and "build 55.0" in out
    assert "Start-up" in (tmp_path / "merged.html").read_text()


def test_summary_statistics():
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["p50_ms"] == 3.0 and s["p99_ms"] > 90 and s["mean_ms"] == 22.0 and s["iters"] == 5


@pytest.mark.slow
def test_startup_cold_then_warm_in_separate_processes():
    from arrcoc.bench.startup import measure_startup

    s = measure_startup("arrcoc-texture", "onnx", (1,), "cpu", None)
    assert s["cold_s"] > 0 and s["warm_s"] > 0
    assert s["cold_stats"]["export_s"] > 1.0 and s["warm_stats"]["export_s"] < 1.0  # the export was cached
    assert s["warm_s"] < s["cold_s"]


# the peers' relevance against the engine's on a CPU: the same Pillow decoding and resize and the
# same model, so only the batch's float arithmetic differs
PEER_RELEVANCE_ATOL = 1e-4


def test_peer_scripts_write_a_parquet_row_per_photo_with_the_engines_relevance(tmp_path):
    """Both peer scripts on a CPU (the one-process peer decodes with Pillow there, and says so):
    each writes a Parquet file pyarrow reads, one row per photo in a row group per batch, and each
    row's relevance is the engine's for that photo."""
    import subprocess
    import sys

    import numpy as np
    import pyarrow.parquet as pq

    from arrcoc.bench.e2e import workload
    from arrcoc.bench.peers import QUERY
    from arrcoc.pipeline import RelevancePipeline

    photos = tmp_path / "photos"
    photos.mkdir()
    jpegs = workload()["jpeg_800x600"][:5]
    for i, data in enumerate(jpegs):
        (photos / f"img{i}.jpg").write_bytes(data)
    expected = RelevancePipeline("arrcoc-texture", device="cpu").infer(jpegs, QUERY)
    for peer in ("dataloader", "batched"):
        out = tmp_path / f"{peer}.parquet"
        argv = [sys.executable, "-m", "arrcoc.bench.peers", peer, "--photos", str(photos), "--out", str(out)]
        proc = subprocess.run(
            [*argv, "--device", "cpu", "--batch", "2", "--workers", "1"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        said = json.loads(proc.stdout.strip().splitlines()[-1])
        assert said["peer"] == peer and said["items"] == said["rows"] == 5 and said["images_per_s"] > 0
        assert ("Pillow" in said["does"]) and ("Parquet" in said["does"])
        parquet = pq.ParquetFile(out)
        assert parquet.metadata.num_rows == 5 and parquet.metadata.num_row_groups == 3  # batches 2, 2, 1
        table = parquet.read()
        assert table["file"].to_pylist() == [f"img{i}.jpg" for i in range(5)]
        relevance = np.array(table["relevance"].to_pylist(), np.float32)
        for row, result in zip(relevance, expected, strict=True):
            np.testing.assert_allclose(row, result.relevance.reshape(-1), atol=PEER_RELEVANCE_ATOL)


def test_the_standard_e2e_job_is_8192_photos_on_a_gpu_and_its_limits_let_it_in():
    """On a GPU the 800x600 job runs for seconds (8,192 photos), on a CPU it keeps its size; the
    run raises the input limits its largest zip needs (entries and bytes), and no more than that."""
    import dataclasses

    import torch

    from arrcoc.bench.e2e import E2EConfig, _limits, standard_items, workload
    from arrcoc.settings import LimitSettings

    assert standard_items(E2EConfig(), torch.device("cuda")) == 8192
    assert standard_items(E2EConfig(), torch.device("cpu")) == 2048
    assert standard_items(E2EConfig(items=16), torch.device("cuda")) == 16
    cfg = dataclasses.replace(E2EConfig(), items=8192)
    photos = workload()["jpeg_800x600"]
    zipped = sum(len(photos[i % len(photos)]) + 100 for i in range(8192))  # + each entry's headers
    limits = _limits(cfg)
    assert limits["max_batch_items"] == 8192 and limits["max_archive_entries"] > 8192
    assert limits["max_archive_bytes"] >= zipped and limits["max_unpacked_bytes"] >= zipped
    LimitSettings(**limits)  # values the settings accept
    defaults = _limits(dataclasses.replace(cfg, items=16, large_items=0, png_items=0))
    assert defaults["max_archive_bytes"] == LimitSettings().max_archive_bytes


def test_end_to_end_benchmark_reports_jobs_requests_and_the_job_over_the_engine(tmp_path):
    """`arrcoc bench e2e` on CPU, in-process, a tiny workload: every batch item and every request
    succeeds, each stage is timed, and the report compares the job with the engine alone timed
    just before and after it, and with the two peer scripts run on the same photos."""
    from arrcoc.bench.e2e import E2EConfig, markdown, run_e2e, write

    cfg = E2EConfig(
        device="cpu",
        backend="eager",
        items=16,
        large_items=0,
        png_items=0,
        requests=8,
        clients=2,
        celery=False,
        rounds=3,
    )
    report = run_e2e(cfg, progress=lambda m: None)
    job = report["batch_inprocess"]["jpeg_800x600"]
    assert job["items"] == 16 and job["failed"] == 0 and job["images_per_s"] > 0
    assert job["stage_ms_per_item"]["engine"] > 0 and job["stage_ms_per_item"]["decode"] > 0
    for key in ("interactive_inprocess_1", "interactive_inprocess_n"):
        assert report[key]["ok"] == report[key]["requests"] and not report[key]["errors"]
    jobs = job["rounds"]  # the batch job too: the figure is the job of median images/s, each one listed
    assert len(jobs) == 3 and job["images_per_s"] == sorted(r["images_per_s"] for r in jobs)[1]
    rounds = report["interactive_inprocess_n"]["rounds"]  # the figure is the median round, each one listed
    assert len(rounds) == 3
    assert (
        report["interactive_inprocess_n"]["throughput_rps"] == sorted(r["throughput_rps"] for r in rounds)[1]
    )
    ratio = report["job_over_engine_alone"]
    mean = (report["engine_alone"]["images_per_s"] + report["engine_alone_after"]["images_per_s"]) / 2
    assert ratio["against_mean"] == round(job["images_per_s"] / mean, 3)
    assert ratio["against_faster"] <= ratio["against_mean"]
    bare = report["batch_inprocess"]["jpeg_800x600_no_overlays"]  # the job without overlays, the same way
    assert ratio["no_overlays"]["against_mean"] == round(bare["images_per_s"] / mean, 3)
    alone = report["stages_alone"]  # the job's other stages alone: what one process cannot outrun
    assert {"decode", "decode_pixels", "overlays", "decode_interactive"} <= set(alone)
    assert "decode_12mp" not in alone
    assert (
        all(a["images_per_s"] > 0 for a in alone.values())
        and alone["overlays"]["batch"] == alone["decode"]["batch"]
    )
    text = markdown(report)
    assert f"drawing and encoding their overlays **{alone['overlays']['images_per_s']}**" in text
    series = report["stages_in_series"]  # the three stages one after another, and the job over that
    one_by_one = 1 / (
        1 / report["engine_alone"]["images_per_s"]
        + 1 / alone["decode"]["images_per_s"]
        + 1 / alone["overlays"]["images_per_s"]
    )
    assert series["images_per_s"] == pytest.approx(one_by_one, abs=0.1)
    assert f"over that: **{series['job_over']}**" in text
    assert "inprocess: unpacking and finalizing" in text
    steps = report["steps_alone"]  # the job's steps without its files, one in flight on a CPU
    assert (
        steps["in_flight"] == 1 and steps["batch"] == alone["decode"]["batch"] and steps["images_per_s"] > 0
    )
    assert f"no files, rows or job store): **{steps['images_per_s']} images/s**" in text
    assert (
        f"**{ratio['against_mean']}** against the mean" in text
        and "| inprocess | jpeg_800x600 | 16 (0 failed) | relevance |" in text
    )
    assert " / ".join(str(r["throughput_rps"]) for r in rounds) in text
    assert f"[{' / '.join(str(r['images_per_s']) for r in jobs)}]" in text
    bare = report["batch_inprocess"]["jpeg_800x600_no_overlays"]  # the job without overlays, its own row
    assert bare["items"] == bare["rows"] == 16 and bare["failed"] == 0
    # each row's job asked for what its name says: the relevance row drew a picture per photo, the other none
    assert job["overlays"] == "relevance" and job["pictures"] == 16
    assert bare["overlays"] == "none" and bare["pictures"] == 0
    peers = report["peers"]  # the hand-written scripts, on the same photos, each writing every row
    assert set(peers) == {"dataloader", "batched"}
    assert all(p["items"] == p["rows"] == 16 and p["images_per_s"] > 0 for p in peers.values()), peers
    assert all(
        f"- {k}: **{p['images_per_s']} images/s**, 16 rows. {p['does']}." in text for k, p in peers.items()
    )
    assert text.splitlines()[0].startswith(f"# End to end — {report['env']['date'][:10]}, ")
    assert f"torch {report['env']['torch']}" in text and f"pyarrow {report['env']['pyarrow']}" in text
    assert (
        "Command: `python -m arrcoc bench e2e --device cpu --backend eager --items 16 --large-items 0"
        " --png-items 0 --requests 8 --clients 2 --no-celery`" in text
    )
    best = report["job_over_best_peer"]
    fastest = max(p["images_per_s"] for p in peers.values())
    assert best["overlays"] == round(job["images_per_s"] / fastest, 3) and "no_overlays" in best
    assert (
        f"**{best['overlays']}x**" in text
        and "| inprocess | jpeg_800x600_no_overlays | 16 (0 failed) | none |" in text
        and f"without overlays **{ratio['no_overlays']['against_mean']}**" in text
    )
    paths = write(report, tmp_path / "e2e")
    assert json.loads(paths[0].read_text())["job_over_engine_alone"] == ratio


def test_a_celery_report_splits_a_requests_mean_into_its_legs():
    """Through Celery a request's mean splits into the legs each result's timings mark (outside the
    task, in the task around the engine call, the engine process's round trip), and the report says
    what its callers, each waiting for its answer, could make at most with no wait for a batch
    ahead; an in-process row has no task to split by and adds no line."""
    from arrcoc.bench.e2e import _legs_lines, celery_legs

    timings = {"task_wall_ms": 19.0, "engine_wall_ms": 18.0, "preprocess_ms": 0.5, "batch_decode_ms": 5.0}
    row = {"clients": 32, "mean_ms": 28.0, "timings_ms_mean": timings | {"model_ms": 1.5}}
    assert celery_legs(row) == {
        "outside_task_ms": 9.0,
        "around_engine_call_ms": 1.0,
        "engine_round_trip_ms": 18.0,
        "own_batch_ms": 7.0,
        "ceiling_rps": 1882.4,  # 32 callers, each request at least 9 + 1 + 7 ms
    }
    said = " ".join(_legs_lines({"interactive_celery_n": row}))
    assert "32 callers: a request's mean of 28.0 ms is 9.0 outside the task" in said
    assert "at most **1,882.4 req/s**" in said
    inprocess = {"clients": 32, "mean_ms": 12.0, "timings_ms_mean": {"model_ms": 1.5, "batch_decode_ms": 4.0}}
    assert celery_legs(inprocess) is None
    assert _legs_lines({"interactive_inprocess_n": inprocess}) == []


def test_a_report_counts_a_worker_groups_processes_in_words():
    from arrcoc.bench.e2e import _processes

    assert _processes(1, "engine") == "1 engine process" and _processes(8, "Celery") == "8 Celery processes"
    assert _processes(8) == "8 processes"


def test_a_phase_whose_items_failed_says_so_beside_its_figures():
    """An e2e report names what failed beside its figures, with the first error (a two-GPU run
    whose engine lost its GPU once reported 413 images/s and nothing else); a clean phase adds
    nothing."""
    from arrcoc.bench.e2e import _failures_lines

    assert _failures_lines({"batch_celery": {"jpeg_800x600": {"items": 16, "failed": 0}}}) == []
    said = "\n".join(
        _failures_lines(
            {
                "batch_celery": {"jpeg_800x600": {"items": 16, "failed": 7}},
                "interactive_celery_n": {"requests": 10, "ok": 4, "errors": ["EngineError: gone\ntrace"]},
            }
        )
    )
    assert "celery batch job jpeg_800x600: 7 of 16 items failed" in said and "6 of 10 requests failed" in said
    assert "first error: EngineError: gone)" in said
