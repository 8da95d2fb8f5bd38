"""The HTTP door (`RateGate`, an ASGI middleware): every call is counted against its client's
limit by the function Gradio will run for it, whatever the route, index type or body, before Gradio
queues it or checks an input; uploads are counted and reserved against the disk budget; a call
naming what does not exist is answered in words. A refused call costs a look-up, never a place in
the queue. docs/security.md says what this protects and what it does not.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs

from arrcoc.errors import AccessDenied, ArrcocError
from arrcoc.settings import get_settings
from arrcoc.tuning import MAX_BODY, UPLOAD_SLACK

from .guard import REFUSALS, address_of, check_rate, limit_key
from .housekeeping import drop_upload, record_upload, reserve_upload

# Which limit each of the app's functions counts against, by api_name (the page's private events
# too: any function can be called by its index). "infer" runs the model, "jobs" submits a job,
# "status" is a poll or a redraw of a stored result. Every function with a Python body is listed
# (a name Gradio numbered, such as render_views_1 for a second event of render_views, by its own
# name); tests/test_gate.py fails when one is not.
LIMIT_KIND = {
    "run": "infer",
    "infer": "infer",
    "infer_foveated": "infer",
    "run_model": "infer",  # a click on an example runs it as Run does
    "run_without_query": "infer",
    "batch_submit": "jobs",
    "bench_submit": "jobs",
    "page_batch_submit": "jobs",
    "page_bench_submit": "jobs",
    "batch_status": "status",
    "batch_cancel": "status",
    "bench_status": "status",
    "batch_poll": "status",
    "bench_poll": "status",
    "page_batch_cancel": "status",
    "show_stored_report": "status",
    "load_matching_report": "status",
    "load_example": "status",
    "on_load": "status",
    "worker_notice": "status",  # the page's warning when a worker cannot serve
    "new_photo": "status",
    "set_scale": "status",
    "render_views": "status",
    "render_impact": "status",
    "overlay_view": "status",
    "lambda": "status",  # the query box's Enter: clicks Run in the browser
}
_NUMBERED = re.compile(r"_\d+$")  # Gradio's suffix for a second event of one function


# ---- the door: counted before Gradio queues or checks anything --------------------------------------------

# The routes that run an app function, as Gradio 6 declares them (gradio/routes.py); the named
# part is the route's api_name. `/run/` and `/api/` take a PredictBody whose fn_index, when given,
# wins over the name; `/call/` and `/call/v2/` go by the name; `/queue/join` by fn_index only.
_QUEUE = re.compile(r"/gradio_api/queue/join/?$")
_DIRECT = re.compile(r"/gradio_api/(?:run|api)/([^/]+)/?$")
_BY_NAME = re.compile(r"/gradio_api/call/(v2/)?([^/]+)/?$")
_RESULTS = re.compile(r"/gradio_api/call/(?:v2/)?[^/]+/([^/]+)/?$")  # GET: a call's event stream
_UPLOAD = re.compile(r"/gradio_api/upload/?$")
# Gradio routes the demo does not use, closed: a screen recording runs ffmpeg on an upload
_CLOSED = re.compile(r"/gradio_api/process_recording/?$")


def max_upload_bytes(settings: Any = None) -> int:
    """The largest file the upload route takes: a batch zip (photos are held to the image limit
    when a call names them, `RateGate._file_problem`)."""
    s = settings or get_settings()
    return max(s.limits.max_image_bytes, s.limits.max_archive_bytes, s.limits.max_manifest_bytes)


def kind_of(fn: Any) -> str:
    """The limit a Gradio function counts against: its api_name's entry in LIMIT_KIND; a function
    with no Python body (the page's own JavaScript) runs nothing here; one missing from the table
    counts as a request (tests/test_gate.py fails while any is missing)."""
    if getattr(fn, "fn", None) is None:
        return "status"
    name = str(getattr(fn, "api_name", "") or "")
    return LIMIT_KIND.get(name) or LIMIT_KIND.get(_NUMBERED.sub("", name), "infer")


@dataclass
class Call:
    """What Gradio will run for a call: its function (None: none, or the body is not one Gradio
    takes) and the values it will be given."""

    fn: Any = None
    data: Any = None
    missing: str = ""  # the endpoint or index the caller named that does not exist


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


class RateGate:
    """ASGI middleware: every call of an app function, through any of Gradio's routes, is counted
    against its client's limit before Gradio sees it, by the function Gradio will run (resolved as
    Gradio resolves it); over the limit it is answered 429 with the reason, which the page shows as
    an error and gradio_client raises. Uploads are counted and reserved against the data store's
    disk budget; a call naming an endpoint, index or file that does not exist gets a 404 saying so."""

    def __init__(self, app: Any, blocks: Any = None):
        self.app, self.blocks = app, blocks

    # -- what Gradio will run --

    def _fns(self) -> dict:
        # Gradio looks up a session's own copy of the functions; this app renders nothing per
        # session, so every copy holds the same functions under the same indexes
        fns = getattr(self.blocks, "fns", None)
        return fns if isinstance(fns, dict) else {}

    def _named(self, name: str) -> Call:
        fn = next((f for f in self._fns().values() if f.api_name == name), None)
        return Call(fn=fn, missing="" if fn else f"/{name}")

    def resolve(self, path: str, body: bytes) -> Call:
        """The function Gradio will run for a POST to `path` with `body`, and its values. A body
        Gradio refuses itself (not JSON, not its model) resolves to no function and no `missing`."""
        from gradio.data_classes import PredictBody, SimplePredictBody

        try:
            doc = json.loads(body)  # what Starlette's request.json() does
        except (ValueError, RecursionError):
            return Call()
        try:
            if m := _BY_NAME.search(path):
                if m[1]:  # /call/v2/: the body is the named parameters
                    return replace(self._named(m[2]), data=doc) if isinstance(doc, dict) else Call()
                return replace(self._named(m[2]), data=SimplePredictBody.model_validate(doc).data)
            predict = PredictBody.model_validate(doc)  # "10" and 10.0 become 10, as in Gradio
        except ValueError:  # pydantic's ValidationError
            return Call()
        direct = _DIRECT.search(path)
        if predict.fn_index is None:
            return replace(self._named(direct[1]), data=predict.data) if direct else Call()
        fn = self._fns().get(predict.fn_index)
        return Call(fn=fn, data=predict.data, missing="" if fn else f"fn_index {predict.fn_index}")

    def _no_such_event(self, path: str, query: bytes) -> bool:
        """Whether a GET of a call's results (/call/<name>/<event_id>, /queue/data) names an event
        or session the queue does not hold: Gradio would start the stream and break it off."""
        queue = getattr(self.blocks, "_queue", None)
        sessions = getattr(queue, "pending_messages_per_session", None)
        if not isinstance(sessions, dict):
            return False
        if m := _RESULTS.search(path):
            event = queue.event_ids_to_events.get(m[1])
            if event is not None:
                return False
            pending = queue.pending_event_ids_session.items()
            session = next((s for s, ids in pending if m[1] in ids), m[1])
        elif path.rstrip("/").endswith("/gradio_api/queue/data"):
            session = parse_qs(query.decode("latin-1")).get("session_hash", [None])[0]
            if session is None:
                return False  # Gradio says the field is required
        else:
            return False
        return session not in sessions

    def _endpoints(self) -> str:
        names = sorted(f"/{f.api_name}" for f in self._fns().values() if _public(f))
        return ", ".join(names)

    # -- the files a call names --

    def _file_problem(self, call: Call) -> tuple[int, dict] | None:
        """(status, answer) when the call names a file that was not uploaded here (404: Gradio
        answered `{"error": null}`, or read the file), or a photo over the image limit (422 in the
        shape of Gradio's own input validation, which gradio_client raises and the page shows beside
        the photo; Gradio would decode it in full first); None when its files are fine."""
        from gradio.components import File
        from gradio.utils import abspath, is_in_or_equal

        cache = str(getattr(self.blocks, "GRADIO_CACHE", "") or "")
        photos_only = not any(isinstance(c, File) for c in getattr(call.fn, "inputs", []))
        limit = get_settings().limits.max_image_bytes
        values = list(call.data.values()) if isinstance(call.data, dict) else list(call.data or [])
        for i, value in enumerate(values):
            for path in _file_paths(value):
                if path.startswith(("http://", "https://")):
                    continue  # fetched by Gradio under its own rules
                shown = path if len(path) <= 80 else "…" + path[-79:]
                if not cache or not is_in_or_equal(abspath(path), cache):
                    return 404, _error(
                        f"The file {shown!r} is not on this server: upload it first (POST /gradio_api/upload,"
                        " as gradio_client's handle_file does) and send the path the upload answers."
                    )
                size = _size(abspath(path))
                if photos_only and size > limit:
                    message = f"The image is {size / 1e6:.1f} MB; the limit is {_mb(limit)} (ARRCOC_LIMITS__MAX_IMAGE_BYTES)."
                    return 422, {"detail": _invalid(call.fn, len(values), i, message)}
        return None

    # -- the door --

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope.get("type") != "http" or scope.get("method") != "POST":
            if scope.get("type") == "http" and self._no_such_event(path, scope.get("query_string", b"")):
                await _json(send, 404, _error(NO_EVENT))
            else:
                await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        peer = (scope.get("client") or ("", 0))[0] or ""
        address = address_of(peer, headers.get("x-forwarded-for", ""), get_settings().access.trusted_proxies)
        bearer = headers.get("authorization", "")
        token = headers.get("x-arrcoc-token", "").strip() or (
            bearer[7:].strip() if bearer[:7].lower() == "bearer " else ""
        )
        key = limit_key(token, address)
        if _UPLOAD.search(path):
            await self._upload(scope, receive, send, headers, key, address)
        elif _CLOSED.search(path):
            await _json(send, 404, _error("This server does not offer that route."))
        elif _QUEUE.search(path) or _DIRECT.search(path) or _BY_NAME.search(path):
            await self._call(scope, receive, send, headers, key, address)
        elif await _counted("status", key, address, send):
            await self.app(scope, receive, send)

    async def _call(
        self, scope: dict, receive: Any, send: Any, headers: dict, key: str, address: str
    ) -> None:
        body = await _read_body(receive, headers)
        if body is None:
            if await _counted("status", key, address, send):
                await _json(send, 413, _error(TOO_LARGE))
            return
        call = self.resolve(scope["path"], body)
        if not await _counted(kind_of(call.fn) if call.fn else "status", key, address, send):
            return
        if call.missing:
            REFUSALS.refused(address, f"no endpoint {call.missing[:80]!r} for {address}")
            message = f"This server has no endpoint {call.missing[:80]!r}; its API: {self._endpoints()}."
            await _json(send, 404, _error(message))
            return
        problem = self._file_problem(call) if call.fn else None
        if problem:
            REFUSALS.refused(address, f"{json.dumps(problem[1])[:200]} ({address})")
            await _json(send, *problem)
            return
        await self.app(scope, _replay(body, receive), send)

    async def _upload(
        self, scope: dict, receive: Any, send: Any, headers: dict, key: str, address: str
    ) -> None:
        """An upload is counted against the client's upload limit and reserved, at its declared
        length, against the data store's disk budget before a byte is written; its files and
        their reservation are swept together (demo/housekeeping.py)."""
        if not await _counted("upload", key, address, send):
            return
        try:
            length = int(headers.get("content-length", ""))
        except ValueError:
            await _json(send, 411, _error("An upload must say its length (Content-Length)."))
            return
        limit = max_upload_bytes()
        if length > limit + UPLOAD_SLACK:
            await _json(
                send,
                413,
                _error(f"The upload is {_mb(length)}; the largest file this server takes is {_mb(limit)}."),
            )
            return
        try:
            owner = key if key.startswith("token:") else ""
            folder = await asyncio.to_thread(reserve_upload, length, owner, address)  # a lock and a scan
        except ArrcocError as e:
            REFUSALS.refused(address, f"upload of {_mb(length)} for {address}: {e}")
            await _json(send, 507, _error(f"This upload was refused: {e}"))
            return

        def done(status: int, paths: list[str]) -> None:
            if status == 200:
                record_upload(folder, paths)
            else:
                drop_upload(folder)

        answer = _Answer(send, done)
        try:
            await self.app(scope, receive, answer.send)
        finally:
            answer.finish()


NO_EVENT = "No such call is waiting for its results here: check the event id the call answered (results are kept until read once)."
TOO_LARGE = f"The request is too large: a call's JSON may be at most {MAX_BODY >> 20} MiB (files go through /gradio_api/upload)."


def _public(fn: Any) -> bool:
    return getattr(fn, "api_visibility", "public") == "public" and bool(getattr(fn, "api_name", ""))


def _file_paths(data: Any) -> list[str]:
    """Every `path` of a file object (a dict with a "path") in a call's values, at any depth."""
    found, stack = [], [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("path"), str):
                found.append(item["path"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def _invalid(fn: Any, count: int, bad: int, message: str) -> list[dict]:
    """Gradio's answer when an input fails validation (queueing.process_validation_response): one
    entry per input, named by the function's parameters."""
    names = list(getattr(fn, "input_parameter_names", None) or inspect.signature(fn.fn).parameters)
    return [
        {
            "__type__": "validate",
            "is_valid": i != bad,
            "message": message if i == bad else "",
            "parameter_name": names[i] if i < len(names) else f"parameter_{i}",
        }
        for i in range(count)
    ]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0  # gone: Gradio says so


async def _read_body(receive: Any, headers: dict) -> bytes | None:
    """The call's body, or None when it is over MAX_BODY (declared or sent): refused unread."""
    try:
        if int(headers.get("content-length") or 0) > MAX_BODY:
            return None
    except ValueError:
        pass
    chunks, size, more = [], 0, True
    while more:  # the body is read once here and replayed to Gradio
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY:
            return None
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class _Answer:
    """Passes Gradio's response to an upload through; before its last piece goes out, `done` is
    given its status and the paths it lists, so the caller never sees an upload not yet recorded."""

    def __init__(self, send: Any, done: Any):
        self._send, self._done, self.status, self._body = send, done, 0, bytearray()

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message["type"] == "http.response.body":
            if len(self._body) < MAX_BODY:
                self._body += message.get("body", b"")
            if not message.get("more_body", False):
                self._done(self.status, self._paths())
                self._done = _ignore
        await self._send(message)

    def _paths(self) -> list[str]:
        try:
            doc = json.loads(bytes(self._body))
        except ValueError:
            return []
        return [p for p in doc if isinstance(p, str)] if isinstance(doc, list) else []

    def finish(self) -> None:
        """The response ended without its last piece (the client left): as a failure."""
        self._done(0, [])


def _ignore(*_: Any) -> None:
    return None


async def _counted(kind: str, key: str, address: str, send: Any) -> bool:
    """Count one call of `kind`; False (answered 429) when the client is over its limit."""
    try:
        check_rate(kind, key)
    except AccessDenied as e:
        REFUSALS.refused(address, f"rate limit ({kind}) for {address}: {e}")
        await _json(send, 429, _error(str(e)))
        return False
    return True


def _error(message: str) -> dict:
    return {"detail": message, "error": message}


async def _json(send: Any, status: int, doc: dict) -> None:
    data = json.dumps(doc).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})
