"""Every chart of the page, as plotly figures for gr.Plot.

One colour per backend in every chart (BACKEND_COLOURS); one panel per model variant when a report
holds several; each figure is built from the report shown, so its legend is that report's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from arrcoc.settings import BACKENDS

BACKEND_COLOURS = {"eager": "#4c78a8", "compiled": "#54a24b", "onnx": "#f58518", "aot": "#b279a2"}
OTHER_COLOUR = "#9d755d"  # a backend this page does not know (a newer report)
GROUP_COLOURS = {"colour": "#e45756", "edges": "#4c78a8", "position": "#72b7b2"}
HEIGHT = 380
FONT = dict(family="system-ui, sans-serif", size=12)

assert set(BACKENDS) <= set(BACKEND_COLOURS), "a backend without a chart colour"


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0.01, font=dict(size=14)),
        template="plotly_white",
        height=height,
        margin=dict(l=64, r=16, t=56, b=96),
        font=FONT,
        bargap=0.25,
        bargroupgap=0.05,
        # under the axes: above them it would cover the panels' titles
        legend=dict(orientation="h", yanchor="top", y=-0.28, xanchor="center", x=0.5, title_text=""),
    )
    return fig


def empty(title: str, note: str = "No report to show.") -> go.Figure:
    fig = _layout(go.Figure(), title)
    fig.add_annotation(
        text=note, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(size=13)
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def colour(backend: str) -> str:
    return BACKEND_COLOURS.get(backend, OTHER_COLOUR)


def _decades(values: pd.Series) -> list[int]:
    """A log axis range of whole decades around the values: a label at each end at least."""
    v = values[values > 0]
    lo, hi = int(np.floor(np.log10(v.min()))), int(np.ceil(np.log10(v.max())))
    return [lo, hi if hi > lo else lo + 1]


def _panels(
    df: pd.DataFrame, title: str, y_title: str, log_y: str | None = None, tick_format: str = "~g"
) -> tuple[go.Figure, list[str]]:
    """One subplot per variant (a shared y axis), buckets as categories on x."""
    variants = list(dict.fromkeys(df["variant"].astype(str)))
    fig = make_subplots(
        rows=1,
        cols=len(variants),
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=variants if len(variants) > 1 else None,
    )
    _layout(fig, title)
    buckets = [str(b) for b in sorted(df["bucket"].dropna().astype(int).unique())]
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=buckets, title_text="batch bucket")
    fig.update_yaxes(title_text=y_title, col=1)
    if log_y:  # a label per power of ten only: minor labels (2, 5) crowd the axis
        fig.update_yaxes(type="log", dtick=1, tickformat=tick_format, range=_decades(df[log_y]))
    return fig, variants


def _backends(df: pd.DataFrame) -> list[str]:
    seen = list(dict.fromkeys(df["backend"].astype(str)))
    return [b for b in BACKENDS if b in seen] + [b for b in seen if b not in BACKENDS]


def latency(df: pd.DataFrame) -> go.Figure:
    """p50 latency by bucket: one line per backend (log scale: buckets span 1 to 64 images)."""
    title = "p50 latency by batch bucket"
    df = df.dropna(subset=["bucket", "p50_ms"]) if len(df) else df
    if df.empty:
        return empty(title)
    fig, variants = _panels(df, title, "ms per batch (p50, log)", log_y="p50_ms")
    for col, v in enumerate(variants, start=1):
        for b in _backends(df):
            rows = df[(df["variant"] == v) & (df["backend"] == b)].sort_values("bucket")
            if rows.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=rows["bucket"].astype(int).astype(str),
                    y=rows["p50_ms"],
                    name=b,
                    legendgroup=b,
                    showlegend=col == 1,
                    mode="lines+markers",
                    line=dict(color=colour(b), width=2.5),
                    marker=dict(color=colour(b), size=7),
                    hovertemplate=f"{b} · bucket %{{x}}: %{{y:.3g}} ms<extra></extra>",
                ),
                row=1,
                col=col,
            )
    return fig


def _grouped_bars(
    df: pd.DataFrame,
    value: str,
    title: str,
    y_title: str,
    fmt: str,
    log_y: bool = False,
    reference: float | None = None,
) -> go.Figure:
    """Bars grouped by bucket, one per backend other than eager (eager is the reference). A report
    without this value (a timing-only report has no parity) gets the empty chart, not an error."""
    if value not in df.columns:
        return empty(title, "This report does not measure it.")
    df = df[df["backend"] != "eager"].dropna(subset=["bucket", value]) if len(df) else df
    if log_y and len(df):
        df = df[df[value] > 0]
    if df.empty:
        return empty(title, "Nothing to compare: the report has eager only (or no report).")
    fig, variants = _panels(
        df, title, y_title, log_y=value if log_y else None, tick_format=".0e" if log_y else "~g"
    )
    for col, v in enumerate(variants, start=1):
        for b in _backends(df):
            rows = df[(df["variant"] == v) & (df["backend"] == b)].sort_values("bucket")
            if rows.empty:
                continue
            fig.add_trace(
                go.Bar(
                    x=rows["bucket"].astype(int).astype(str),
                    y=rows[value],
                    name=b,
                    legendgroup=b,
                    showlegend=col == 1,
                    marker=dict(color=colour(b), line=dict(color=colour(b), width=1)),
                    hovertemplate=f"{b} · bucket %{{x}}: %{{y:{fmt}}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
        if reference is not None:
            fig.add_hline(y=reference, line=dict(color="#666", dash="dot", width=1), row=1, col=col)
    fig.update_layout(barmode="group")
    return fig


def speedup(df: pd.DataFrame) -> go.Figure:
    return _grouped_bars(
        df,
        "speedup_vs_eager",
        "speedup vs eager (p50; dotted line: eager = 1×)",
        "× faster than eager",
        ".2f",
        reference=1.0,
    )


def parity(df: pd.DataFrame) -> go.Figure:
    return _grouped_bars(
        df,
        "max_abs_diff",
        "parity: max |Δ| of the relevance map vs eager",
        "max abs difference (log)",
        ".1e",
        log_y=True,
    )


def report_figures(df: pd.DataFrame) -> tuple[go.Figure, go.Figure, go.Figure]:
    return latency(df), speedup(df), parity(df)


# ---- the inference views' charts -------------------------------------------------------------


def budget_curve(tokens: np.ndarray) -> go.Figure:
    """Tokens per kept cell, by relevance rank."""
    ranks = np.arange(1, len(tokens) + 1)
    fig = _layout(go.Figure(), "tokens by relevance rank", height=320)
    fig.add_trace(
        go.Scatter(
            x=ranks,
            y=tokens,
            mode="lines",
            line=dict(color="#6366f1", width=2.5),
            name="tokens",
            fill="tozeroy",
            fillcolor="rgba(99,102,241,0.15)",
            hovertemplate="rank %{x}: %{y} tokens<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="rank of kept cell (1 = most relevant)")
    fig.update_yaxes(title_text="tokens", rangemode="tozero")
    fig.update_layout(showlegend=False)
    return fig


def attribution(df: pd.DataFrame) -> go.Figure:
    """Correlation of each texture channel with relevance, coloured by channel group."""
    fig = _layout(go.Figure(), "correlation of each texture channel with relevance", height=400)
    for group, rows in df.groupby("group", sort=False):
        fig.add_trace(
            go.Bar(
                x=rows["channel"],
                y=rows["correlation"],
                name=str(group),
                marker=dict(color=GROUP_COLOURS.get(str(group), OTHER_COLOUR)),
                hovertemplate="%{x}: %{y:+.2f}<extra></extra>",
            )
        )
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=list(df["channel"]), tickangle=-35)
    fig.update_yaxes(title_text="Pearson r", range=[-1, 1], zeroline=True, zerolinecolor="#888")
    fig.update_layout(margin=dict(l=64, r=16, t=56, b=150), legend=dict(y=-0.45))
    return fig
