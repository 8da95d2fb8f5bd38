"""What a request is, checked on either side of the queue: torch-free.

The submitting side (the demo, `arrcoc submit`, the Celery executor) checks a request here
before anything is queued; the engine host checks it again with the same functions. Nothing here
imports torch, so a web process that only forwards requests never loads the engine.
"""

from __future__ import annotations

import functools
import hashlib
import math
import numbers
import unicodedata
from dataclasses import asdict, dataclass
from typing import Any

from .errors import InvalidInputError
from .images import ImageLimits, check_header, decode, read_bytes
from .settings import DEFAULT_OVERLAY_KIND, DEFAULT_OVERLAYS, OVERLAY_KINDS, OVERLAYS, LimitSettings, Settings

# The allocator's range of tokens per selected cell (level of detail): arrcoc.attending reads
# them here, so a token budget is checked with the same numbers the model allocates with.
MIN_CELL_TOKENS = 64
MAX_CELL_TOKENS = 400
# How the K cells are chosen (arrcoc.attending): "top" by relevance alone, "diverse" with the
# peaks of other regions brought forward. The model's controls carry the mode's index here.
SELECTION_MODES = ("top", "diverse")
DEFAULT_SELECTION = "top"


@dataclass(frozen=True)
class Controls:
    """What a user may change per request (arr-coc-0-1's sliders, K and the token budget)."""

    scale_information: float = 1.0
    scale_perspectival: float = 1.0
    scale_participatory: float = 1.0
    k: int | None = None  # None: the variant's default
    token_budget: int | None = None
    selection: str | None = None  # None: DEFAULT_SELECTION; else one of SELECTION_MODES

    def validated(self, cells: int, default_k: int, default_budget: int) -> Controls:
        """These controls checked for a model of `cells` cells, defaults filled in (InvalidInputError
        for bad ones). Remembered per value and type (True == 1, but a bool is no number here):
        every request checks its controls, mostly the same few."""
        values = (
            self.scale_information,
            self.scale_perspectival,
            self.scale_participatory,
            self.k,
            self.token_budget,
            self.selection,
        )
        key = tuple((type(v), v) for v in values)
        try:
            hash(key)
        except TypeError:  # an unhashable value (a list from the wire): checked as it is, with its error
            return self._validated(cells, default_k, default_budget)
        return _validated(key, cells, default_k, default_budget)

    def _validated(self, cells: int, default_k: int, default_budget: int) -> Controls:
        scales = (self.scale_information, self.scale_perspectival, self.scale_participatory)
        if any(not _is_number(s) or not math.isfinite(s) or s < 0 or s > 10 for s in scales):
            raise InvalidInputError("Scorer scales must be numbers between 0 and 10.")
        if sum(scales) <= 0:
            raise InvalidInputError("At least one scorer scale must be above 0.")
        k = default_k if self.k is None else _whole(self.k, "K")
        if not 1 <= k <= cells:
            raise InvalidInputError(f"K must be between 1 and {cells} (the number of cells).")
        budget = (
            default_budget if self.token_budget is None else _whole(self.token_budget, "The token budget")
        )
        if not MIN_CELL_TOKENS * k <= budget <= MAX_CELL_TOKENS * cells:
            raise InvalidInputError(
                f"The token budget must be between {MIN_CELL_TOKENS}*K = {MIN_CELL_TOKENS * k} and"
                f" {MAX_CELL_TOKENS * cells} tokens."
            )
        selection = DEFAULT_SELECTION if self.selection is None else self.selection
        if not isinstance(selection, str) or selection not in SELECTION_MODES:
            raise InvalidInputError(
                f"The selection must be one of {', '.join(SELECTION_MODES)}, got {selection!r}."
            )
        return Controls(*(float(s) for s in scales), k, budget, selection)

    def as_row(self) -> list[float]:
        return [
            self.scale_information,
            self.scale_perspectival,
            self.scale_participatory,
            float(self.k),
            float(self.token_budget),
            float(SELECTION_MODES.index(self.selection or DEFAULT_SELECTION)),
        ]

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, doc: dict[str, Any] | None) -> Controls:
        return cls(**(doc or {}))


def check_overlay_kind(value: object) -> str:
    """What a step's overlays show (OVERLAY_KINDS; None: the default), or a clear error."""
    if value is None:
        return DEFAULT_OVERLAY_KIND
    if not isinstance(value, str) or value not in OVERLAY_KINDS:
        raise InvalidInputError(f"The overlay kind must be one of {', '.join(OVERLAY_KINDS)}, got {value!r}.")
    return value


def check_overlays(value: object) -> str:
    """What a batch job asks to be drawn (OVERLAYS; None: DEFAULT_OVERLAYS, no pictures), or a
    clear error naming the option."""
    if value is None:
        return DEFAULT_OVERLAYS
    if not isinstance(value, str) or value not in OVERLAYS:
        raise InvalidInputError(f"overlays must be one of {', '.join(OVERLAYS)}, got {value!r}.")
    return value


@functools.lru_cache(maxsize=256)
def _validated(
    typed: tuple[tuple[type, Any], ...], cells: int, default_k: int, default_budget: int
) -> Controls:
    return Controls(*(v for _, v in typed))._validated(cells, default_k, default_budget)


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _whole(x: object, what: str) -> int:
    if not _is_number(x) or not math.isfinite(x) or int(x) != x:
        raise InvalidInputError(f"{what} must be a whole number, got {x!r}.")
    return int(x)


# Control characters (NUL, ESC and the rest of C0/C1, DEL) and the bidirectional overrides that
# reorder text on screen: a query holding them is refused, never echoed into logs, terminals or
# pages. Tab and newlines are whitespace and are normalised away.
_CONTROL = {
    *range(0x00, 0x09),
    0x0B,
    0x0C,
    *range(0x0E, 0x20),
    *range(0x7F, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
}


MAX_QUERY_CHARS: int = LimitSettings.model_fields["max_query_chars"].default


def validate_query(query: object, max_chars: int = MAX_QUERY_CHARS) -> str:
    """A clean query string (whitespace normalised), or a clear error."""
    if not isinstance(query, str):
        raise InvalidInputError(f"The query must be text, got {type(query).__name__}.")
    bad = next((ch for ch in query if ord(ch) in _CONTROL), None)
    if bad is not None:
        raise InvalidInputError(f"The query holds a control character (U+{ord(bad):04X}); type plain text.")
    # what the encoder's tokenizer takes: text that is valid UTF-8 (no lone surrogates, which its
    # Rust side refuses with a TypeError) and free of invisible format characters (right-to-left
    # marks, zero-width spaces, a byte-order mark: Unicode's Cf), which change nothing a reader
    # sees but what the model reads
    bad = next((ch for ch in query if unicodedata.category(ch) in ("Cs", "Cf")), None)
    if bad is not None:
        what = (
            "a lone surrogate (not valid UTF-8)"
            if unicodedata.category(bad) == "Cs"
            else "an invisible format character"
        )
        raise InvalidInputError(f"The query holds {what} (U+{ord(bad):04X}); type plain text.")
    text = " ".join(query.split())
    if not text:
        raise InvalidInputError("The query is empty: describe what to look for, e.g. 'the red mug'.")
    if len(text) > max_chars:
        raise InvalidInputError(f"The query is {len(text)} characters; the limit is {max_chars}.")
    if not any(ch.isalnum() for ch in text):
        raise InvalidInputError("The query has no letters or digits: describe what to look for.")
    return text


def image_limits(settings: Settings) -> ImageLimits:
    return ImageLimits(
        settings.limits.max_image_bytes, settings.limits.max_image_pixels, settings.limits.min_image_side
    )


def check_image_header(data: bytes, settings: Settings) -> tuple[int, int]:
    """The forwarding side's check: size, format and dimensions from the header, so bad input is
    refused before it is queued, without decoding an image the worker decodes anyway. A corrupt
    body is reported by whoever decodes it, with the same ImageError."""
    limits = image_limits(settings)
    return check_header(read_bytes(data, limits), limits)


def validate_image(data: bytes, settings: Settings):
    """Decode and check (ImageError with a clear message for bad bytes); returns the RGB image."""
    limits = image_limits(settings)
    return decode(read_bytes(data, limits), limits)


def image_key(settings: Settings, data: bytes) -> str:
    """Where the submitting side stores an image's bytes for a worker: by content, so a repeated
    image is stored once."""
    return f"{settings.service.redis_prefix}:img:{hashlib.sha256(data).hexdigest()}"
