"""What a user is told when a call fails: their mistake in one throttled log line and their own
words, a fault's traceback once in our log and a plain message."""

from __future__ import annotations

import logging
import threading
import time

import gradio as gr

from arrcoc.errors import ArrcocError

log = logging.getLogger("arrcoc.demo")


class RefusalLog:
    """One log line per refusal, at most `per_key` lines per client every `window_s` seconds; the
    rest are counted and said in the next line that gets through, so a flood cannot fill the log."""

    def __init__(self, per_key: int = 3, window_s: float = 60.0, max_keys: int = 10_000):
        self.per_key, self.window_s, self.max_keys = per_key, window_s, max_keys
        self._lock = threading.Lock()
        self._seen: dict[str, list[float]] = {}  # key -> [window start, lines, suppressed]

    def reset(self) -> None:
        """Forget every client's lines (tests; a restart does the same)."""
        with self._lock:
            self._seen.clear()

    def refused(self, key: str, message: str) -> bool:
        """Log one `refused:` line unless this client's lines are over budget; True when logged."""
        now = time.monotonic()
        with self._lock:
            entry = self._seen.get(key)
            if entry is None or now - entry[0] >= self.window_s:
                if len(self._seen) >= self.max_keys:
                    self._seen.clear()
                suppressed = int(entry[2]) if entry else 0
                entry = self._seen[key] = [now, 0, suppressed]
            if entry[1] >= self.per_key:
                entry[2] += 1
                return False
            entry[1] += 1
            suppressed, entry[2] = int(entry[2]), 0
        more = f" ({suppressed} more from this client not logged)" if suppressed else ""
        log.info("refused: %s%s", message, more)
        return True


# users' mistakes (bad input, no token, unknown job): one line each, at most 30 a minute in all
REFUSALS = RefusalLog(per_key=30, window_s=60.0)


def user_error(e: Exception) -> gr.Error:
    """A user's mistake: one log line and their message. A fault: the traceback (once, in our log),
    and a plain message. Gradio prints no second traceback for either (print_exception=False)."""
    if isinstance(e, ArrcocError):
        REFUSALS.refused("input", f"{type(e).__name__}: {str(e)[:300]}")
        return gr.Error(str(e), title="Cannot run that", print_exception=False)
    log.exception("demo handler failed")
    return gr.Error(
        "Something went wrong on the server. Try again; details are in the server log.", print_exception=False
    )


def friendly(e: Exception) -> str:
    """A user-facing message for any job error shown in the page (not raised)."""
    if isinstance(e, ArrcocError):
        REFUSALS.refused("input", f"{type(e).__name__}: {str(e)[:300]}")
        return str(e)
    log.error("demo job handler failed", exc_info=e)
    return (
        f"Something went wrong on the server ({type(e).__name__}). Try again; details are in the server log."
    )
