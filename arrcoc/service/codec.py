"""The wire formats: RelevanceResult <-> a reply frame (an interactive request's answer, pushed to
the client's reply list in Redis) or JSON (a Celery result, for messages that name no reply list),
and errors <-> JSON (in both, and in the engine process's replies).

Arrays travel as their exact bytes (dtype and shape alongside), so the result rebuilt on the client
is bit-identical to the worker's: same `to_json()` (the JSON of `arrcoc infer`), same texture. A
frame carries them raw after a JSON head; JSON carries them as base64 (a third larger, and
encoded and decoded on every hop). Neither form runs code when read (no pickle).
"""

from __future__ import annotations

import base64
import json
import math
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
_ARRAYS = (
    "relevance",
    "information",
    "perspectival",
    "participatory",
    "balance",
    "tensions",
    "selected",
    "budgets",
    "budget_map",
    "texture",
)


def _pack(a: np.ndarray) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    return {
        "dtype": a.dtype.str,
        "shape": list(a.shape),
        "b64": base64.b64encode(a.tobytes()).decode("ascii"),
    }


def _unpack(d: dict[str, Any]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(d["b64"]), dtype=np.dtype(d["dtype"])).reshape(d["shape"]).copy()


def _split(result: RelevanceResult) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A result's plain fields (JSON-safe, with the wire version) and its arrays, in _ARRAYS order."""
    head: dict[str, Any] = {"wire": WIRE_VERSION}
    head |= {f.name: getattr(result, f.name) for f in fields(result) if f.name not in _ARRAYS}
    head["image_size"] = list(result.image_size)
    return head, {name: np.ascontiguousarray(getattr(result, name)) for name in _ARRAYS}


def _joined(head: dict[str, Any], arrays: dict[str, np.ndarray]) -> RelevanceResult:
    kwargs = {
        f.name: head[f.name] for f in fields(RelevanceResult) if f.name in head and f.name not in _ARRAYS
    }
    return RelevanceResult(**kwargs | arrays | {"image_size": tuple(head["image_size"])})


def result_to_wire(result: RelevanceResult) -> dict[str, Any]:
    head, arrays = _split(result)
    return head | {name: _pack(a) for name, a in arrays.items()}


def result_from_wire(doc: dict[str, Any]) -> RelevanceResult:
    return _joined(doc, {name: _unpack(doc[name]) for name in _ARRAYS})


# -- reply frames: b"R" + head length (4 bytes, little-endian) + JSON head + the arrays' bytes,
# or b"E" + the error's JSON
_FRAME_DTYPES = frozenset({"<f2", "<f4", "<f8", "<i4", "<i8", "|u1", "|b1"})  # what a result's arrays are


def result_to_frame(result: RelevanceResult) -> bytes:
    head, arrays = _split(result)
    head["arrays"] = [[a.dtype.str, list(a.shape)] for a in arrays.values()]
    h = json.dumps(head).encode()
    return b"".join([b"R", len(h).to_bytes(4, "little"), h, *(a.data for a in arrays.values())])


def error_to_frame(exc: BaseException) -> bytes:
    return b"E" + json.dumps(error_to_wire(exc)).encode()


def result_from_frame(frame: bytes) -> RelevanceResult:
    """The result a frame carries; the error it carries is raised. A frame that is not one of
    ours is an EngineError, never a crash or a wrong result."""
    if frame[:1] == b"E":
        raise error_from_wire(json.loads(frame[1:]))
    try:
        if frame[:1] != b"R":
            raise ValueError("not a reply frame")
        n = int.from_bytes(frame[1:5], "little")
        head = json.loads(frame[5 : 5 + n])
        offset = 5 + n
        arrays = {}
        for name, (dtype, shape) in zip(_ARRAYS, head["arrays"], strict=True):
            if dtype not in _FRAME_DTYPES:
                raise ValueError(f"dtype {dtype!r}")
            count, dt = math.prod(shape), np.dtype(dtype)
            arrays[name] = np.frombuffer(frame, dt, count, offset).reshape(shape).copy()  # writable, its own
            offset += count * dt.itemsize
        if offset != len(frame):
            raise ValueError(f"{len(frame) - offset} bytes left over")
        return _joined(head, arrays)
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:
        raise EngineError(f"The worker's reply could not be read ({type(e).__name__}: {e}).") from None


# Errors cross the queue as {"type": name, "message": text} and are raised again on the client.
_ERRORS: dict[str, type[ArrcocError]] = {
    c.__name__: c
    for c in (
        ArrcocError,
        InvalidInputError,
        ImageError,
        EngineError,
        JobError,
        JobCancelled,
        DeadlineExceeded,
        ServiceUnavailableError,
        UnknownVariantError,
        WeightsError,
        AccessDenied,
    )
}


def error_to_wire(exc: BaseException) -> dict[str, str]:
    if not isinstance(exc, ArrcocError):  # a bug or the device failing: say what happened
        return {"type": "EngineError", "message": f"The worker failed: {type(exc).__name__}: {exc}"}
    name = next(c.__name__ for c in type(exc).__mro__ if c.__name__ in _ERRORS)
    return {"type": name, "message": str(exc)}


def error_from_wire(doc: dict[str, str]) -> ArrcocError:
    return _ERRORS.get(doc.get("type", ""), ArrcocError)(doc.get("message", "the worker failed"))
