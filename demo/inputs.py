"""Values from the page and the API, checked at the boundary: text, numbers, uploads, the sliders as
Controls; and the Gradio patch that routes Gradio's own preprocessing through these checks, so a
value of the wrong type gets a clear error instead of being converted (or failing inside Gradio)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from arrcoc.errors import InvalidInputError
from arrcoc.request import Controls, validate_query
from arrcoc.settings import get_settings

log = logging.getLogger("arrcoc.demo")


def text_field(value: object, what: str) -> str:
    """A text field as the API sent it: None is empty, anything but text is refused."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidInputError(f"{what} must be text, got {type(value).__name__}.")
    return value


def upload(path: object, what: str) -> Path | None:
    if path is None or path == "":
        return None
    if not isinstance(path, str):
        raise InvalidInputError(f"{what} must be an uploaded file.")
    return Path(path)


def number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError(f"{what} must be a number, got {type(value).__name__} {str(value)[:40]!r}.")
    return float(value)


def whole(value: object, what: str) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value != value
        or value in (float("inf"), float("-inf"))
    ):
        raise InvalidInputError(f"{what} must be a number, got {value!r}.")
    if int(value) != value:
        raise InvalidInputError(f"{what} must be a whole number, got {value!r}.")
    return int(value)


def controls_from(s_info: object, s_persp: object, s_part: object, k: object, budget: object) -> Controls:
    """The sliders as Controls; a value that is not a number (a string, a list) is refused in words,
    never converted. Ranges are checked where the model is known (Controls.validated)."""
    scales = [
        number(v, n)
        for v, n in (
            (s_info, "The information scale"),
            (s_persp, "The perspectival scale"),
            (s_part, "The participatory scale"),
        )
    ]
    return Controls(*scales, whole(k, "K"), whole(budget, "The token budget"))


def read_image(path: object) -> bytes:
    p = upload(path, "The photo")
    if p is None:
        raise InvalidInputError("Upload a photo first (or click one of the examples).")
    return p.read_bytes()


def query_text(query: object) -> str:
    """The query as typed, checked for length here: the text box never cuts it silently."""
    text = text_field(query, "The query")  # a number or a list is refused, not turned into text
    # the same checks and words as the service
    return validate_query(text, get_settings().limits.max_query_chars)


# ---- the Gradio patch -------------------------------------------------------------------------------


def photo_input(**kwargs: Any) -> Any:
    """A filepath gr.Image that passes files Pillow cannot open on to our own checks (load_image),
    which explain the problem in words instead of failing inside Gradio's preprocessing."""
    import gradio as gr

    comp = gr.Image(type="filepath", image_mode=None, **kwargs)
    strict = comp.preprocess

    def lenient(payload):
        try:
            return strict(payload)
        except Exception:
            return str(payload.path) if payload is not None and payload.path else None

    comp.preprocess = lenient  # type: ignore[method-assign]
    return comp


def strict_inputs(blocks: Any) -> None:
    """Every Textbox and Slider of the app refuses a value of the wrong type sent through the API
    (Gradio would turn a number or a list into text, and fail on a string slider with no message):
    the caller gets a clear error instead. Called once on the built Blocks."""
    import gradio as gr

    from .errors import REFUSALS

    def wrap(comp: Any, ok: Any, what: str) -> None:
        inner = comp.preprocess

        def preprocess(payload: Any) -> Any:
            if (payload is not None or isinstance(comp, gr.Slider)) and not ok(payload):
                label = comp.label or what
                REFUSALS.refused("input", f"{type(payload).__name__} for {label!r}")
                raise gr.Error(
                    f"{label} must be {what}, got {type(payload).__name__}.", title="Cannot run that"
                )
            return inner(payload)

        comp.preprocess = preprocess

    for block in list(getattr(blocks, "blocks", {}).values()):
        if isinstance(block, gr.Textbox):
            wrap(block, lambda v: isinstance(v, str), "text")
        elif isinstance(block, gr.Slider):  # None too: the page always sends a number
            wrap(block, lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number")
        elif isinstance(block, gr.Dropdown) and not block.multiselect:
            wrap(block, lambda v: isinstance(v, str), "one of its choices (text)")
