"""The page's look and small shared pieces: title, CSS, theme, captions, and the event options
every tab uses."""

from __future__ import annotations

from typing import Any

import gradio as gr

TITLE = "ARR-COC Serve — query-aware visual relevance"
CSS = """
.arr-legend {display:flex; align-items:center; gap:8px; font-size:0.85em; margin:2px 4px;}
.arr-legend-title {font-weight:600; margin-right:4px;}
.arr-legend-bar {flex:1; height:12px; border-radius:3px; min-width:120px;}
.arr-progress {position:relative; height:22px; background:var(--block-background-fill);
  border:1px solid var(--border-color-primary); border-radius:6px; overflow:hidden;}
.arr-progress-fill {height:100%; background:linear-gradient(90deg,#6366f1,#f59e0b); transition:width .4s;}
.arr-progress span {position:absolute; inset:0; text-align:center; font-size:0.85em; line-height:22px;}
.arr-caption {color: var(--body-text-color-subdued); font-size: 0.9em;}
.arr-match {padding:8px 12px; border-radius:8px; font-size:0.95em; border:1px solid var(--border-color-primary);}
.arr-match-unsure {background: rgba(99,102,241,0.08); border-color: rgba(99,102,241,0.45);}
.arr-match-weak {background: rgba(245,158,11,0.16); border-color: rgba(217,119,6,0.7);}
.arr-match-none {color: var(--body-text-color-subdued);}
.arr-gallery {display:grid; grid-template-columns:repeat(auto-fill, minmax(220px, 1fr)); gap:12px;}
.arr-item {margin:0; padding:8px; border:1px solid var(--border-color-primary); border-radius:8px;
  background: var(--block-background-fill);}
.arr-item img {width:100%; height:180px; object-fit:contain; display:block;}
.arr-item figcaption {font-size:0.85em; line-height:1.35; margin-top:6px; overflow-wrap:anywhere;}
.arr-weak {color:#b45309; font-weight:600;}
.arr-texture .fixed-height {min-height: 0 !important; max-height: none !important;}
.arr-texture .grid-wrap {overflow-y: visible !important;}
"""
THEME = gr.themes.Soft(primary_hue="indigo", secondary_hue="amber")
PUSH_JOB_JS = "(id) => { const u = new URL(window.location); if (id) { u.searchParams.set('job', id); window.history.replaceState(null, '', u); } }"
PRIVATE: dict[str, Any] = {"api_visibility": "private"}  # the page's own events: not API endpoints


def mb(n: int) -> str:
    return f"{n / 1024 / 1024:.0f} MB"


def md(text: str) -> str:
    return text.replace("*", "\\*")


def caption(text: str) -> gr.Markdown:
    return gr.Markdown(text, elem_classes="arr-caption")
