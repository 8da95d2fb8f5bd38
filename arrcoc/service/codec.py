"""RelevanceResult <-> JSON for the wire (Celery results) and for batch job rows.

The wire document is exactly `RelevanceResult.to_json()` (the JSON of `arrcoc infer`) plus the
texture array, so a result rebuilt on the client gives the same `to_json()` as the original.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..balancing import TENSION_NAMES
from ..errors import ArrcocError, EngineError, ImageError, InvalidInputError, JobError
from ..result import RelevanceResult


def result_to_wire(result: RelevanceResult) -> dict[str, Any]:
    doc = result.to_json()
    doc["texture"] = np.round(result.texture.astype(np.float64), 6).tolist()  # (13, G, G)
    return doc


def result_from_wire(doc: dict[str, Any]) -> RelevanceResult:
    grid = lambda key: np.asarray(doc[key], dtype=np.float64)  # noqa: E731
    texture = doc.get("texture")
    g = int(doc["grid"])
    return RelevanceResult(
        variant=doc["variant"],
        weights_version=doc["weights_version"],
        backend=doc["backend"],
        query=doc["query"],
        relevance=grid("relevance"),
        information=grid("information"),
        perspectival=grid("perspectival"),
        participatory=grid("participatory"),
        balance=np.asarray(doc["balance"], dtype=np.float64),
        tensions=np.asarray([doc["tensions"][n] for n in TENSION_NAMES], dtype=np.float64),
        selected=np.asarray(doc["selected"], dtype=np.int64),
        budgets=np.asarray(doc["budgets"], dtype=np.int64),
        budget_map=np.asarray(doc["budget_map"], dtype=np.int64),
        texture=np.asarray(texture, dtype=np.float64) if texture is not None else np.zeros((13, g, g)),
        image_size=tuple(doc["image_size"]),
        token_budget=int(doc["token_budget"]),
        benchmark_only=bool(doc.get("benchmark_only", False)),
        bucket=doc.get("bucket"),
        timings_ms=dict(doc.get("timings_ms", {})),
    )


# Errors cross the queue as {"type": name, "message": text} and are raised again on the client.
_ERRORS: dict[str, type[ArrcocError]] = {
    c.__name__: c for c in (ArrcocError, InvalidInputError, ImageError, EngineError, JobError)
}


def error_to_wire(exc: BaseException) -> dict[str, str]:
    if not isinstance(exc, ArrcocError):  # a bug or the device failing: say what happened
        return {"type": "EngineError", "message": f"The worker failed: {type(exc).__name__}: {exc}"}
    name = next(c.__name__ for c in type(exc).__mro__ if c.__name__ in _ERRORS)
    return {"type": name, "message": str(exc)}


def error_from_wire(doc: dict[str, str]) -> ArrcocError:
    return _ERRORS.get(doc.get("type", ""), ArrcocError)(doc.get("message", "the worker failed"))
