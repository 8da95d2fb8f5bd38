"""What a user is told when a call fails: their mistake in one throttled log line and their own
words, a fault's traceback once in our log and a plain message."""

from __future__ import annotations

import logging

import gradio as gr

from arrcoc.errors import ArrcocError

from .guard import RefusalLog

log = logging.getLogger("arrcoc.demo")
# users' mistakes (bad input, no token, unknown job): one line each, at most 30 a minute in all
REFUSALS = RefusalLog(per_key=30, window_s=60.0)


def user_error(e: Exception) -> gr.Error:
    """A user's mistake: one log line and their message. A fault: the traceback (once, in our log),
    and a plain message. Gradio prints no second traceback for either (print_exception=False)."""
    if isinstance(e, ArrcocError):
        REFUSALS.refused("input", f"{type(e).__name__}: {str(e)[:300]}")
        return gr.Error(str(e), title="Cannot run that", print_exception=False)
    log.exception("demo handler failed")
    return gr.Error("Something went wrong on the server. Try again; details are in the server log.", print_exception=False)


def friendly(e: Exception) -> str:
    """A user-facing message for any job error shown in the page (not raised)."""
    if isinstance(e, ArrcocError):
        REFUSALS.refused("input", f"{type(e).__name__}: {str(e)[:300]}")
        return str(e)
    log.error("demo job handler failed", exc_info=e)
    return f"Something went wrong on the server ({type(e).__name__}). Try again; details are in the server log."
