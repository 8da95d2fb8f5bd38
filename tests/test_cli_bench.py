"""`arrcoc bench` as a user meets it: defaults that suit the device, plain lines when piped, plots
from the install the README uses."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def parsed(*argv: str):
    import argparse

    from arrcoc.cli import bench

    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    return bench, parser.parse_args(["bench", *argv])


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_defaults_suit_the_device(device, capsys):
    import torch

    from arrcoc.settings import BACKENDS, get_settings

    bench, args = parsed()
    bench._resolve(args, torch.device(device))
    said = capsys.readouterr().out
    if device == "cpu":  # seconds, not the GPU's matrix: compiled and aot take minutes to build on a CPU
        assert args.variants == ["arrcoc-texture"] and args.backends == ["eager", "onnx"]
        assert args.buckets == [1, 4] and args.iters == 10 and args.warmup_iters == 2
    else:
        assert args.variants == ["arrcoc-texture", "arrcoc-clip-b16"] and args.backends == list(BACKENDS)
        assert tuple(args.buckets) == get_settings().engine.buckets and args.iters == 100
    assert f"on {device}" in said and "--backends" in said, said
    # what is asked for is what runs, on any device
    bench, args = parsed("--backends", "eager", "compiled", "--buckets", "1", "8", "64", "--iters", "3")
    bench._resolve(args, torch.device("cpu"))
    assert args.backends == ["eager", "compiled"] and args.buckets == [1, 8, 64] and args.iters == 3
    assert "--backends" not in capsys.readouterr().out


def test_piped_output_is_one_plain_line_per_step(tmp_path):
    """Not a terminal: no progress-bar frames ('\\r'), no library warnings, one line per step."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "default",
    }  # warnings on, as a user's shell may have them
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "arrcoc",
            "bench",
            "--variants",
            "arrcoc-texture",
            "--backends",
            "eager",
            "--buckets",
            "1",
            "2",
            "--iters",
            "2",
            "--warmup-iters",
            "1",
            "--out",
            str(tmp_path),
            "--name",
            "piped",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stream in (proc.stdout, proc.stderr):
        assert "\r" not in stream and "it/s" not in stream
        assert "Warning" not in stream, stream[-2000:]
    steps = [line for line in proc.stdout.splitlines() if re.match(r"\[\s*\d+%\s+[\d.]+ s\] ", line)]
    assert [s.split("] ", 1)[1] for s in steps] == [  # what starts, then what is done
        "arrcoc-texture: loading the model",
        "arrcoc-texture: preparing eager (building and warming up)",
        "arrcoc-texture: eager ready",
        "arrcoc-texture: timing batches of 1",
        "arrcoc-texture: bucket 1",
        "arrcoc-texture: timing batches of 2",
        "arrcoc-texture: bucket 2",
    ]
    assert steps[-1].startswith("[100%")
    report = json.loads((tmp_path / "piped.json").read_text())
    assert {(r["backend"], r["bucket"]) for r in report["results"]} == {("eager", 1), ("eager", 2)}
    assert (tmp_path / "piped.png").is_file() == (importlib.util.find_spec("matplotlib") is not None)


def test_the_readme_install_brings_the_plots():
    """scripts/setup.sh installs `.[dev]`; the README promises plots from `arrcoc bench`: the dev
    extra pulls matplotlib in (through `plots`)."""
    assert '-e ".[dev]"' in (ROOT / "scripts" / "setup.sh").read_text()
    assert "plots" in (ROOT / "README.md").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def closure(name: str, seen: set[str]) -> list[str]:
        seen.add(name)
        out = []
        for dep in extras[name]:
            m = re.fullmatch(r"arrcoc\[([^\]]+)\].*", dep.split(";")[0].strip())
            if m:
                out += [
                    d for sub in m.group(1).split(",") if sub not in seen for d in closure(sub.strip(), seen)
                ]
            else:
                out.append(dep)
        return out

    assert any(d.startswith("matplotlib") for d in closure("dev", set()))


def test_an_onnx_export_keeps_the_exporters_info_lines_out_of_the_log(tmp_path, caplog):
    """One export wrote hundreds of onnx_ir/onnxscript INFO lines into the demo's log; their
    warnings still show, and the loggers' own levels are as they were afterwards."""
    import logging

    import torch

    from arrcoc.engine.onnx import EXPORTER_LOGGERS, export_onnx
    from arrcoc.registry import create_model

    before = {name: logging.getLogger(name).level for name in EXPORTER_LOGGERS}
    with caplog.at_level(logging.INFO):
        export_onnx(create_model("arrcoc-texture", None, "cpu"), tmp_path / "m.onnx", torch.device("cpu"), 1)
    noisy = [r for r in caplog.records if r.name.split(".")[0] in ("onnx_ir", "onnxscript", "torch")]
    assert all(r.levelno >= logging.WARNING for r in noisy), [r.getMessage()[:80] for r in noisy[:5]]
    assert (tmp_path / "m.onnx").stat().st_size > 0
    assert {name: logging.getLogger(name).level for name in EXPORTER_LOGGERS} == before


def test_a_second_run_never_overwrites_the_first_and_nothing_lands_in_benchmarks(tmp_path, monkeypatch):
    """Reports were named by date only (a second run the same day overwrote the first) and went to
    the tracked benchmarks/: now bench-out/ (git-ignored), named by date and time, with a counter
    when the name is taken (two runs in one second, or a merge of reports)."""
    from arrcoc.cli.bench import DEFAULT_OUT

    bench, args = parsed()
    assert args.out == DEFAULT_OUT == Path("bench-out")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "bench-out/bench-2026-11-27-101500-cpu.json"], cwd=ROOT
    )
    assert ignored.returncode == 0, "bench-out/ is not git-ignored"
    for output in ("out.json", "out.png", "view.png", "selection.md", "batch-0123456789abcdef.zip"):
        assert subprocess.run(["git", "check-ignore", "-q", output], cwd=ROOT).returncode == 0, output
    assert "--out benchmarks" not in "".join(
        line for line in (ROOT / "README.md").read_text().splitlines() if "arrcoc bench" in line
    )

    monkeypatch.chdir(tmp_path)
    bench, args = parsed()
    report = {"env": {"gpu": None, "date": "2026-11-27T10:15:00+00:00"}, "results": []}
    first = bench._stem(report, args)
    assert first == Path("bench-out") / "bench-2026-11-27-101500-cpu"
    first.parent.mkdir()
    for suffix in (".json", ".md"):
        first.with_suffix(suffix).write_text("{}")
    second = bench._stem(report, args)
    assert second == Path("bench-out") / "bench-2026-11-27-101500-cpu-2"
    second.with_suffix(".json").write_text("{}")
    assert bench._stem(report, args).name == "bench-2026-11-27-101500-cpu-3"
    later = {"env": {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-27T10:16:00+00:00"}}
    assert bench._stem(later, args).name == "bench-2026-11-27-101600-h100"
    dated = {"env": {"gpu": None, "date": "2026-11-22"}}  # an older report's date, merged by --render
    assert bench._stem(dated, args).name == "bench-2026-11-22-cpu"
    bench, args = parsed("--name", "mine")  # a name given is used as given
    assert bench._stem(report, args) == Path("bench-out") / "mine"


def test_the_plots_legends_cover_no_bar_or_line():
    """The CPU plot's legend sat over the compiled bar at bucket 1: every legend is beside its
    plot now, clear of the axes where the bars and lines are drawn."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arrcoc.bench.report import png_figure

    rows = [
        dict(variant="arrcoc-texture", backend=b, bucket=n, p50_ms=p, speedup_vs_eager=s)
        for b, n, p, s in [
            ("eager", 1, 160.0, 1.0),
            ("onnx", 1, 60.0, 2.7),
            ("eager", 4, 600.0, 1.0),
            ("onnx", 4, 250.0, 2.4),
        ]
    ]
    fig = png_figure({"results": rows})
    fig.canvas.draw()
    try:
        for ax in fig.axes:
            legend = ax.get_legend()
            assert legend is not None
            box, plot = legend.get_window_extent(), ax.get_window_extent()
            assert box.x0 >= plot.x1, (box, plot)  # right of the plot area, not over it
            assert box.x1 <= fig.bbox.x1 + 1, "the legend is cut off at the figure's edge"
    finally:
        plt.close(fig)
