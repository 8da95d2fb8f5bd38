"""Benchmark reports on the page: this machine's own (what `arrcoc bench` wrote into its output
folder here), the stored ones under benchmarks/ (measured elsewhere, kept in the repository), which
of them matches this server, and any report as a table, a title and downloadable files."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from arrcoc.cli.bench import DEFAULT_OUT

from .housekeeping import served

BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"
# this machine's reports: where `arrcoc bench` writes by default, from the folder the demo runs in
LOCAL_DIR = DEFAULT_OUT
LOCAL_PREFIX = "here:"  # a choice that names a report of LOCAL_DIR rather than of BENCH_DIR
RESULT_COLUMNS = (
    "variant",
    "backend",
    "bucket",
    "p50_ms",
    "p99_ms",
    "throughput_per_s",
    "speedup_vs_eager",
    "max_abs_diff",
    "topk_agreement",
    "compile_s",
    "capture_s",
)  # fmt: skip -- the report schema of the benchmark harness (arrcoc/bench)


@dataclass(frozen=True)
class Machine:
    """What a report was measured on, or what this server runs: a variant on a kind of device."""

    variant: str
    device: str  # "cpu", a GPU's name, or "" when unknown (a queue's workers)

    def words(self) -> str:
        where = "a CPU" if self.device == "cpu" else (self.device or "the queue's workers")
        return f"`{self.variant}` on {where}"


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    rows = doc.get("results") if isinstance(doc, dict) else None
    if isinstance(rows, list) and any(
        isinstance(r, dict) and {"backend", "bucket", "p50_ms"} <= r.keys() for r in rows
    ):
        return doc
    return None  # other JSON under benchmarks/ (batching studies, ...) is not a benchmark report


def report_device(report: dict[str, Any]) -> str:
    env = report.get("env") or {}
    return str(env.get("gpu") or "") or (
        "cpu" if env.get("device", "cpu") == "cpu" else str(env.get("device"))
    )


def report_variants(report: dict[str, Any]) -> list[str]:
    return sorted(
        {
            str(r.get("variant"))
            for r in report.get("results") or []
            if isinstance(r, dict) and r.get("variant")
        }
    )


def matches(report: dict[str, Any], server: Machine) -> bool:
    """Measured on this server's kind of device (any, when the server cannot see it) for its variant."""
    same_device = not server.device or report_device(report) == server.device
    return same_device and server.variant in report_variants(report)


def report_label(name: str, report: dict[str, Any]) -> str:
    """A dropdown label that says what the report is: variants · device — the file name (which
    carries the date), short enough to be read whole beside the job's controls; this machine's
    own reports say so first."""
    device = report_device(report)
    device = "CPU" if device == "cpu" else (device.removeprefix("NVIDIA ").split() or ["GPU"])[0]
    here = "this machine · " if name.startswith(LOCAL_PREFIX) else ""
    return f"{here}{', '.join(report_variants(report))} · {device} — {name.removeprefix(LOCAL_PREFIX)}"


def stored_reports(folder: Path | None = None) -> list[str]:
    """File names of the benchmark reports under benchmarks/: newest day first, and within a day
    the most complete report (most result rows) first. File times mean nothing after a clone."""
    folder = BENCH_DIR if folder is None else folder
    reports = [(f, _read_report(f)) for f in sorted(folder.glob("*.json"))] if folder.is_dir() else []

    def rank(item: tuple[Path, dict[str, Any]]) -> tuple[str, int, str]:
        f, rep = item
        return (str(rep.get("env", {}).get("date", ""))[:10], len(rep.get("results", [])), f.name)

    return [f.name for f, rep in sorted((r for r in reports if r[1] is not None), key=rank, reverse=True)]


def stored_report(name: str, folder: Path | None = None) -> dict[str, Any] | None:
    """A report by its choice: a file of `folder` (BENCH_DIR), or of LOCAL_DIR behind LOCAL_PREFIX."""
    if name.startswith(LOCAL_PREFIX):
        name, folder = name.removeprefix(LOCAL_PREFIX), LOCAL_DIR
    folder = BENCH_DIR if folder is None else folder
    return _read_report(folder / Path(name).name) if name else None  # a bare name: no paths from the page


def report_choices(folder: Path | None = None) -> list[str]:
    """Every report the page offers, as choices for stored_report: this machine's first, newest
    first, then the stored ones."""
    return [LOCAL_PREFIX + n for n in stored_reports(LOCAL_DIR)] + stored_reports(folder)


def report_source(name: str) -> str:
    """Where a choice's file is, as the report's title names it."""
    if name.startswith(LOCAL_PREFIX):
        return f"Run on this machine: {LOCAL_DIR.as_posix()}/{name.removeprefix(LOCAL_PREFIX)}"
    return f"Stored report: benchmarks/{name}"


def newest_report(folder: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """The newest stored report under benchmarks/ and its file name (None when there is none)."""
    names = stored_reports(folder)
    return (stored_report(names[0], folder), names[0]) if names else (None, "")


def matching_report(server: Machine, folder: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """The report measured like this server (its variant, its kind of device) that tells most
    about it: this machine's newest, else the newest stored one; and its choice."""
    for name in report_choices(folder):
        report = stored_report(name, folder)
        if report is not None and matches(report, server):
            return report, name
    return None, ""


def report_frame(report: dict[str, Any] | None) -> pd.DataFrame:
    """The report's results as a table; speedup vs eager derived from p50 where the report lacks it."""
    rows = [r for r in (report or {}).get("results") or [] if isinstance(r, dict)]
    df = pd.DataFrame([{c: r.get(c) for c in RESULT_COLUMNS} for r in rows], columns=list(RESULT_COLUMNS))
    if rows and df["throughput_per_s"].isna().all():
        df["throughput_per_s"] = [r.get("images_per_s") for r in rows]
    for c in RESULT_COLUMNS[2:]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    if rows and df["speedup_vs_eager"].isna().all():
        eager = df[df["backend"] == "eager"].set_index(["variant", "bucket"])["p50_ms"]
        ref = [eager.get((v, b)) for v, b in zip(df["variant"], df["bucket"], strict=True)]
        df["speedup_vs_eager"] = pd.to_numeric(pd.Series(ref), errors="coerce") / df["p50_ms"]
    errors = [r.get("error") for r in rows]
    if any(errors):
        df["error"] = errors
    df = df.round(
        {
            "p50_ms": 3,
            "p99_ms": 3,
            "throughput_per_s": 2,
            "speedup_vs_eager": 2,
            "max_abs_diff": 8,
            "topk_agreement": 4,
            "compile_s": 2,
            "capture_s": 2,
        }
    )
    return df.dropna(axis=1, how="all") if rows else df


def measured_on(report: dict[str, Any]) -> str:
    """The device and the date of a report, in words: "an NVIDIA H100 …" or "a CPU (x86_64, 2 cores)"."""
    env = report.get("env") or {}
    if env.get("gpu"):
        where = str(env["gpu"])
    else:
        kind = ", ".join(
            str(b) for b in (env.get("cpu"), env.get("cpu_count") and f"{env['cpu_count']} cores") if b
        )
        where = "a CPU" + (f" ({kind})" if kind else "")
    date = str(env.get("date") or "")
    when = f"{date[:10]} {date[11:16]} UTC" if len(date) >= 16 else (date or "an unknown date")
    return f"measured on **{where}** on **{when}**"


def report_markdown(report: dict[str, Any] | None, source: str) -> str:
    """The report's title: where its file is, the device and date it was measured on (a stored
    report was measured on another machine: said beside it), then its versions."""
    if not report:
        return "**No benchmark report yet.** Run one above; the newest stored report (`benchmarks/*.json`) is shown here once it exists."
    env = report.get("env") or {}
    bits = [
        f"{k} `{env[k]}`"
        for k in ("torch", "triton", "onnxruntime", "cuda", "driver", "commit")
        if env.get(k)
    ]
    rec = report.get("recompiles_after_warmup")
    if rec is not None:
        bits.append(f"recompiles after warmup: **{rec}**")
    elsewhere = (
        " — **on another machine**: this one may be much faster or slower; a benchmark run here "
        "(above, or `arrcoc bench`) is listed first and shown instead."
        if source.startswith("Stored report")
        else ""
    )
    versions = " · ".join([f"schema {report.get('schema', '?')}", *bits])
    return f"**{source}**, {measured_on(report)}{elsewhere}\n\n<span class='arr-caption'>{versions}</span>"


def report_files(report: dict[str, Any], stem: str) -> list[str]:
    """The report as JSON and CSV, written once per report (by content) into the served temp folder."""
    text = json.dumps(report, indent=2)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)[:80] or "report"
    folder = served(f"report-{hashlib.sha256(text.encode()).hexdigest()[:16]}")
    json_path, csv_path = folder / f"{stem}.json", folder / f"{stem}.csv"
    if not (json_path.exists() and csv_path.exists()):
        json_path.write_text(text)
        report_frame(report).to_csv(csv_path, index=False)
    return [str(json_path), str(csv_path)]
