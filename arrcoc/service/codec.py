"""The wire format: RelevanceResult <-> JSON (Celery results) and errors <-> JSON (Celery results
and the engine process's replies), one form for both.

Arrays travel as base64 of their exact bytes (dtype and shape alongside), so the result rebuilt on
the client is bit-identical to the worker's: same `to_json()` (the JSON of `arrcoc infer`), same
texture. This is also ~20x cheaper to encode than nested float lists.
"""

from __future__ import annotations

import base64
from dataclasses import fields
from typing import Any

import numpy as np

from ..errors import (
    AccessDenied,
    ArrcocError,
    DeadlineExceeded,
    EngineError,
    ImageError,
    InvalidInputError,
    JobCancelled,
    JobError,
    ServiceUnavailableError,
    UnknownVariantError,
    WeightsError,
)
from ..result import RelevanceResult

WIRE_VERSION = 1
_ARRAYS = ("relevance", "information", "perspectival", "participatory", "balance", "tensions", "selected",
           "budgets", "budget_map", "texture")  # fmt: skip


def _pack(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def _unpack(d: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def result_to_wire(result: RelevanceResult) -> dict[str, Any]:
    doc: dict[str, Any] = {"wire": WIRE_VERSION}
    for f in fields(result):
        value = getattr(result, f.name)
        doc[f.name] = _pack(np.asarray(value)) if f.name in _ARRAYS else value
    doc["image_size"] = list(result.image_size)
    return doc


def result_from_wire(doc: dict[str, Any]) -> RelevanceResult:
    kwargs = {f.name: doc[f.name] for f in fields(RelevanceResult) if f.name in doc}
    for name in _ARRAYS:
        kwargs[name] = _unpack(doc[name])
    kwargs["image_size"] = tuple(doc["image_size"])
    return RelevanceResult(**kwargs)


# Errors cross the queue as {"type": name, "message": text} and are raised again on the client.
_ERRORS: dict[str, type[ArrcocError]] = {
    c.__name__: c
    for c in (ArrcocError, InvalidInputError, ImageError, EngineError, JobError, JobCancelled, DeadlineExceeded,
              ServiceUnavailableError, UnknownVariantError, WeightsError, AccessDenied)  # fmt: skip
}


def error_to_wire(exc: BaseException) -> dict[str, str]:
    if not isinstance(exc, ArrcocError):  # a bug or the device failing: say what happened
        return {"type": "EngineError", "message": f"The worker failed: {type(exc).__name__}: {exc}"}
    name = next(c.__name__ for c in type(exc).__mro__ if c.__name__ in _ERRORS)
    return {"type": name, "message": str(exc)}


def error_from_wire(doc: dict[str, str]) -> ArrcocError:
    return _ERRORS.get(doc.get("type", ""), ArrcocError)(doc.get("message", "the worker failed"))
