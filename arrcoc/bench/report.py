"""Render a benchmark report: markdown table, self-contained HTML (inline SVG), PNG plots."""

from __future__ import annotations

import html
import json
from pathlib import Path

COLORS = {"eager": "#7f7f7f", "compiled": "#d62728", "onnx": "#1f77b4", "aot": "#9467bd"}


def _f(x, nd: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return (
            f"{x:.{nd}g}"
            if abs(x) < 1e-2 and x != 0
            else f"{x:,.{nd}f}".rstrip("0").rstrip(".")
            if nd
            else f"{x:,.0f}"
        )
    return str(x)


def markdown_table(report: dict) -> str:
    head = (
        "| variant | backend | bucket | p50 ms | p99 ms | images/s | speedup vs eager | max abs diff | top-K agree |"
        " compile s | capture s | peak MB | break-even calls |"
    )
    lines = [head, "|" + "---|" * 13]
    for r in report["results"]:
        lines.append(
            f"| {r['variant']} | {r['backend']} | {r['bucket']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} |"
            f" {r['throughput_per_s']:,.0f} | {r['speedup_vs_eager']:.2f}× | {r['max_abs_diff']:.1e} |"
            f" {r['topk_agreement']:.2f} | {r['compile_s']:.1f} | {r['capture_s']:.2f} |"
            f" {_f(r.get('peak_mem_mb'), 0)} | {_f(r['break_even_calls'], 0)} |"
        )
    if report.get("startup"):
        lines += [
            "",
            "| variant | backend | cold start s | warm start s | warm / cold | cold process s | warm process s |"
            " where the cold start went |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in report["startup"]:
            lines.append(
                f"| {s['variant']} | {s['backend']} | {s['cold_s']:.1f} | {s['warm_s']:.1f} | {s['warm_over_cold']:.2f} |"
                f" {_f(s.get('cold_process_s'), 1)} | {_f(s.get('warm_process_s'), 1)} | {_breakdown(s.get('cold_stats'))} |"
            )
    lines += ["", f"Recompiles after warmup: {report['recompiles_after_warmup']}."]
    return "\n".join(lines) + "\n"


def _breakdown(stats: dict | None) -> str:
    """The cold start's parts in seconds: build/export/compile, load, capture, top compile phases."""
    if not stats:
        return "–"
    keys = ("build_s", "export_s", "load_s", "session_s", "compile_s", "capture_s")
    parts = [
        f"{k[:-2]} {stats[k]:.1f}"
        for k in keys
        if isinstance(stats.get(k), (int, float)) and stats[k] >= 0.05
    ]
    phases = sorted((stats.get("compile_phases") or {}).items(), key=lambda kv: -kv[1])[:3]
    parts += [f"{name} {sec:.1f}" for name, sec in phases]
    return ", ".join(parts) or "–"


def _series(report: dict, variant: str, key: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in report["results"]:
        if r["variant"] == variant:
            out.setdefault(r["backend"], []).append((r["bucket"], r[key]))
    return out


def _svg_lines(series: dict[str, list[tuple[int, float]]], title: str, ylabel: str, w=460, h=300) -> str:
    """Log-log line chart (x: bucket, y: value), one line per backend, with hover titles."""
    import math

    pts = [(b, v) for s in series.values() for b, v in s if v and v > 0]
    if not pts:
        return ""
    x0, x1 = math.log2(min(b for b, _ in pts)), math.log2(max(b for b, _ in pts)) or 1.0
    y0, y1 = math.log10(min(v for _, v in pts)), math.log10(max(v for _, v in pts))
    y0, y1 = math.floor(y0 * 2) / 2, math.ceil(y1 * 2) / 2 + (0.5 if y1 == y0 else 0)
    L, R, T, B = 60, 110, 30, 40

    def X(b):
        return L + (math.log2(b) - x0) / max(x1 - x0, 1e-9) * (w - L - R)

    def Y(v):
        return h - B - (math.log10(v) - y0) / (y1 - y0) * (h - T - B)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
        f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
        f'<line x1="{L}" y1="{h - B}" x2="{w - R}" y2="{h - B}" stroke="#000"/>',
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{h - B}" stroke="#000"/>',
        f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">{html.escape(ylabel)}</text>',
        f'<text x="{(L + w - R) / 2}" y="{h - 6}" text-anchor="middle">batch (bucket)</text>',
    ]
    for b in sorted({b for b, _ in pts}):
        parts.append(f'<text x="{X(b):.1f}" y="{h - B + 14}" text-anchor="middle">{b}</text>')
    e = y0
    while e <= y1 + 1e-9:
        parts.append(
            f'<line x1="{L - 4}" y1="{Y(10**e):.1f}" x2="{w - R}" y2="{Y(10**e):.1f}" stroke="#ddd"/>'
        )
        parts.append(f'<text x="{L - 6}" y="{Y(10**e) + 4:.1f}" text-anchor="end">{10**e:.3g}</text>')
        e += 0.5
    for i, (name, s) in enumerate(series.items()):
        s = sorted((b, v) for b, v in s if v and v > 0)
        c = COLORS.get(name, "#2ca02c")
        d = " ".join(f"{X(b):.1f},{Y(v):.1f}" for b, v in s)
        parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2"/>')
        for b, v in s:
            parts.append(
                f'<circle cx="{X(b):.1f}" cy="{Y(v):.1f}" r="3.5" fill="{c}"><title>{name} bucket {b}: {v:.4g}</title></circle>'
            )
        parts.append(
            f'<rect x="{w - R + 10}" y="{T + 16 * i}" width="10" height="10" fill="{c}"/>'
            f'<text x="{w - R + 24}" y="{T + 9 + 16 * i}">{html.escape(name)}</text>'
        )
    return "".join(parts) + "</svg>"


def write_html(report: dict, path: Path) -> None:
    variants = list(dict.fromkeys(r["variant"] for r in report["results"]))
    charts = []
    for v in variants:
        charts.append(_svg_lines(_series(report, v, "p50_ms"), f"{v}: p50 latency", "ms"))
        charts.append(_svg_lines(_series(report, v, "speedup_vs_eager"), f"{v}: speedup vs eager (p50)", "×"))
        charts.append(_svg_lines(_series(report, v, "throughput_per_s"), f"{v}: throughput", "images/s"))
    env = report["env"]
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(_f(r.get(k)))}</td>"
            for k in (
                "variant",
                "backend",
                "bucket",
                "p50_ms",
                "p90_ms",
                "p99_ms",
                "throughput_per_s",
                "speedup_vs_eager",
                "max_abs_diff",
                "topk_agreement",
                "compile_s",
                "capture_s",
                "peak_mem_mb",
                "break_even_calls",
            )
        )
        + "</tr>"
        for r in report["results"]
    )
    heads = "".join(
        f"<th>{h}</th>"
        for h in (
            "variant",
            "backend",
            "bucket",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "images/s",
            "speedup",
            "max |Δ|",
            "top-K",
            "compile s",
            "capture s",
            "peak MB",
            "break-even",
        )
    )
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>ARR-COC benchmark</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:2px 6px;text-align:right}}svg{{margin:4px;border:1px solid #eee}}</style></head><body>
<h1>ARR-COC benchmark</h1><p>{html.escape(str(env.get("gpu") or env.get("cpu")))} · torch {env.get("torch")} ·
triton {env.get("triton")} · onnxruntime {env.get("onnxruntime")} · CUDA {env.get("cuda")} · driver {env.get("driver")}
· commit {str(env.get("commit"))[:10]} · {env.get("date")} · recompiles after warmup:
{report["recompiles_after_warmup"]}</p><div>{"".join(charts)}</div>
<table><tr>{heads}</tr>{rows}</table>{_startup_html(report)}</body></html>"""
    path.write_text(doc)


def _startup_html(report: dict) -> str:
    if not report.get("startup"):
        return ""
    heads = ("variant", "backend", "cold start s", "warm start s", "warm / cold", "where the cold start went")
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(c)}</td>"
            for c in (
                s["variant"],
                s["backend"],
                _f(s["cold_s"], 1),
                _f(s["warm_s"], 1),
                _f(s.get("warm_over_cold"), 2),
                _breakdown(s.get("cold_stats")),
            )
        )
        + "</tr>"
        for s in report["startup"]
    )
    return f"<h2>Start-up (new process)</h2><table><tr>{''.join(f'<th>{h}</th>' for h in heads)}</tr>{rows}</table>"


def write_png(report: dict, path: Path) -> bool:
    """Latency and speedup by bucket per variant (needs matplotlib: in `arrcoc[plots]` and `[dev]`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = png_figure(report)
    if fig is None:
        return False
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def png_figure(report: dict):
    """The PNG's matplotlib figure (None: no results to plot); matplotlib imported by the caller."""
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(r["variant"] for r in report["results"]))
    if not variants:
        return None
    fig, axes = plt.subplots(len(variants), 2, figsize=(11, 4 * len(variants)), squeeze=False)
    for row, v in enumerate(variants):
        for col, (key, label) in enumerate(
            (("p50_ms", "p50 latency (ms)"), ("speedup_vs_eager", "speedup vs eager (p50)"))
        ):
            ax = axes[row][col]
            series = _series(report, v, key)
            if key == "p50_ms":
                for name, s in series.items():
                    s = sorted(s)
                    ax.plot([b for b, _ in s], [y for _, y in s], "o-", label=name, color=COLORS.get(name))
                ax.set_yscale("log")
            else:
                names = [n for n in series if n != "eager"]
                buckets = sorted({b for s in series.values() for b, _ in s})
                width = 0.8 / max(len(names), 1)
                for i, name in enumerate(names):
                    d = dict(series[name])
                    ax.bar(
                        [j + i * width for j in range(len(buckets))],
                        [d.get(b, 0) for b in buckets],
                        width,
                        label=name,
                        color=COLORS.get(name),
                    )
                ax.set_xticks(
                    [j + width * (len(names) - 1) / 2 for j in range(len(buckets))], [str(b) for b in buckets]
                )
                ax.axhline(1.0, color="#888", lw=0.8)
            if key == "p50_ms":
                ax.set_xscale("log", base=2)
                ticks = sorted({b for s in series.values() for b, _ in s})
                ax.set_xticks(ticks, [str(b) for b in ticks])
                ax.minorticks_off()
            ax.set_title(f"{v}: {label}")
            ax.set_xlabel("batch (bucket)")
            if names := [n for n in series if key == "p50_ms" or n != "eager"]:
                # beside the plot, not over it: inside, it covered the first bucket's bar
                ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)
            else:  # eager alone: nothing to compare it with
                ax.text(
                    0.5,
                    0.5,
                    "only eager: nothing to compare",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                )
            ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_all(report: dict, stem: Path) -> list[Path]:
    """stem.json, stem.md, stem.html and (with matplotlib) stem.png."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md"), stem.with_suffix(".html")]
    paths[0].write_text(json.dumps(report, indent=1))
    paths[1].write_text(markdown_table(report))
    write_html(report, paths[2])
    if write_png(report, stem.with_suffix(".png")):
        paths.append(stem.with_suffix(".png"))
    return paths
